"""Pytrees: a call's arguments flatten the same by the short path as by the walk."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from mpl.driver.tree import NO_ARGS, flatten, flatten_call, unflatten

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
