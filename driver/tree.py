"""Minimal pytrees: nested lists, tuples (named ones too) and dicts, flattened to leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["LEAF", "flatten", "tree_map", "unflatten"]

# A tree definition: ("leaf",) or (kind, aux, children) with kind in list/tuple/dict/namedtuple.
TreeDef = tuple[Any, ...]
LEAF: TreeDef = ("leaf",)  # the tree of a lone leaf
_LEAF = LEAF


def flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(node: Any, leaves: list[Any]) -> TreeDef:
    t = type(node)
    if t is list:
        return ("list", None, tuple(_flatten(x, leaves) for x in node))
    if t is tuple:
        return ("tuple", None, tuple(_flatten(x, leaves) for x in node))
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return ("namedtuple", t, tuple(_flatten(x, leaves) for x in node))
    if t is dict:
        keys = tuple(node)
        return ("dict", keys, tuple(_flatten(node[k], leaves) for k in keys))
    leaves.append(node)
    return _LEAF


def unflatten(treedef: TreeDef, leaves: list[Any]) -> Any:
    it = iter(leaves)
    out = _build(treedef, it)
    return out


def _build(treedef: TreeDef, it: Any) -> Any:
    if treedef[0] == "leaf":
        return next(it)
    kind, aux, children = treedef
    items = [_build(c, it) for c in children]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    if kind == "namedtuple":
        return aux(*items)
    return dict(zip(aux, items, strict=True))


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    leaves, treedef = flatten(tree)
    return unflatten(treedef, [fn(x) for x in leaves])
