"""Pytrees: a call's arguments flatten the same by the short path as by the walk."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from mpl.driver.tree import NO_ARGS, flatten, flatten_call, flatten_call_plain, unflatten

Pair = collections.namedtuple("Pair", "a b")


class Row(tuple[Any, ...]):
    """A tuple subclass without ``_fields``: a leaf, not a container."""


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1,), {}),
    ((1, "x", None, 2.5), {}),
    (tuple(range(12)), {}),  # more leaves than the built-once definitions
    (([1, 2],), {}),
    ((1, {"k": 2}), {}),
    ((Pair(1, 2),), {}),
    ((Row((1, 2)),), {}),
    ((1,), {"k": 2}),
    ((), {"k": [1, (2, 3)]}),
]


@pytest.mark.parametrize("call", CALLS, ids=range(len(CALLS)))
def test_a_call_flattens_as_its_walk_does(call: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
    args, kwargs = call
    leaves, treedef = flatten_call(args, kwargs)
    assert (leaves, treedef) == flatten((args, kwargs))
    assert unflatten(treedef, leaves) == (args, kwargs)


def test_a_call_without_arguments_has_one_tree_definition() -> None:
    assert flatten_call((), {})[1] is NO_ARGS == flatten(((), {}))[1]


@pytest.mark.parametrize("call", CALLS, ids=range(len(CALLS)))
def test_a_plain_flattened_call_unflattens_to_the_same_call(
    call: tuple[tuple[Any, ...], dict[str, Any]],
) -> None:
    args, kwargs = call
    leaves, treedef = flatten_call_plain(args, kwargs)
    assert unflatten(treedef, leaves) == (args, kwargs)


class Held:
    """Stands for a Value: not plain data, so what holds it stays a tree."""


def test_only_plain_data_is_one_leaf() -> None:
    held = Held()
    long = list(range(5000))
    leaves, treedef = flatten_call_plain(
        (long, [held, (1, 2)], Pair(1, 2), {"k": {"n": [None, b"x", 2.5, True]}}), {"s": "t"}
    )
    # the long list, the plain tuple beside the held object, the dict: one leaf each; a
    # namedtuple stays a tree (its class travels in the program, never in a binding)
    assert leaves == [long, held, (1, 2), 1, 2, {"k": {"n": [None, b"x", 2.5, True]}}, "t"]
    assert leaves[0] is long
    assert unflatten(treedef, leaves)[0][2] == Pair(1, 2)
    deep: Any = 1
    for _ in range(40):  # deeper than plain data is taken whole: a tree
        deep = [deep]
    assert len(flatten_call_plain((deep,), {})[0]) == 1
    assert flatten_call_plain((deep,), {})[0] != [deep]
