"""Minimal pytrees: nested lists, tuples (named ones too) and dicts, flattened to leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "LEAF",
    "MANY_LEAVES",
    "NO_ARGS",
    "flatten",
    "flatten_call",
    "flatten_call_plain",
    "tree_map",
    "unflatten",
]

# A tree definition: ("leaf",) or (kind, aux, children) with kind in list/tuple/dict/namedtuple.
TreeDef = tuple[Any, ...]
LEAF: TreeDef = ("leaf",)  # the tree of a lone leaf
_LEAF = LEAF


def flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def flatten_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], TreeDef]:
    """``flatten((args, kwargs))`` of a call, the same leaves and the same tree definition,
    without the walk for the commonest calls: no arguments, or positional ones that are
    all leaves (no list, tuple or dict among them)."""
    if not kwargs:
        if not args:
            return [], NO_ARGS
        for x in args:
            t = type(x)
            if t is list or t is dict or isinstance(x, tuple):
                break
        else:
            treedef = _FLAT_CALLS.get(len(args))
            if treedef is None:
                treedef = ("tuple", None, (("tuple", None, (_LEAF,) * len(args)), _NO_KWARGS))
            return list(args), treedef
    return flatten((args, kwargs))


# A call with more leaves than this is flattened again by flatten_call_plain (PPU calls).
MANY_LEAVES = 1024
_ATOMS = frozenset({int, float, bool, str, bytes, type(None)})
_PLAIN_DEPTH = 32  # deeper plain data stays a tree: the codec bounds nesting too


def flatten_call_plain(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], TreeDef]:
    """:func:`flatten_call`, but each argument that is plain data (a list, tuple or dict of
    ints, floats, bools, strs, bytes and None, nested) is one leaf, not one per item: a
    function called on a list of 200,000 ints gets one input, not 200,000 (each an op
    input of its program and a binding of its Exec: seconds to build and encode, and a
    program past the broker's limit). The function receives the same value either way."""
    leaves: list[Any] = []
    positional = tuple(_flatten_plain(x, leaves) for x in args)
    keys = tuple(kwargs)
    named = tuple(_flatten_plain(kwargs[k], leaves) for k in keys)
    return leaves, ("tuple", None, (("tuple", None, positional), ("dict", keys, named)))


def _flatten_plain(node: Any, leaves: list[Any]) -> TreeDef:
    t = type(node)
    if (t is list or t is tuple or t is dict) and _plain(node, 0):
        leaves.append(node)
        return _LEAF
    if t is list:
        return ("list", None, tuple(_flatten_plain(x, leaves) for x in node))
    if t is tuple:
        return ("tuple", None, tuple(_flatten_plain(x, leaves) for x in node))
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return ("namedtuple", t, tuple(_flatten_plain(x, leaves) for x in node))
    if t is dict:
        keys = tuple(node)
        return ("dict", keys, tuple(_flatten_plain(node[k], leaves) for k in keys))
    leaves.append(node)
    return _LEAF


def _plain(node: Any, depth: int) -> bool:
    """``node`` is an atom, or an exact list, tuple or dict of plain data (atom keys)."""
    t = type(node)
    if t in _ATOMS:
        return True
    if depth >= _PLAIN_DEPTH:
        return False
    if t is list or t is tuple:
        for x in node:  # noqa: SIM110  (a plain loop: all() builds a generator per list)
            if not _plain(x, depth + 1):
                return False
        return True
    if t is dict:
        for k, v in node.items():  # noqa: SIM110
            if type(k) not in _ATOMS or not _plain(v, depth + 1):
                return False
        return True
    return False


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


_NO_KWARGS: TreeDef = ("dict", (), ())
NO_ARGS: TreeDef = ("tuple", None, (("tuple", None, ()), _NO_KWARGS))  # of ``((), {})``
# calls with a few positional leaves: one tree definition each, built once
_FLAT_CALLS = {n: ("tuple", None, (("tuple", None, (_LEAF,) * n), _NO_KWARGS)) for n in range(1, 9)}


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
