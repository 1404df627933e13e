"""A node's ``runtime_info`` in a session: how big it may be, and whether a worker serves it.

A session opened with its own spec (``mp.connect(url, cluster=spec)``) carries each named
node's ``runtime_info`` to that node's worker. The worker checks ``version`` and
``platform`` against what it runs, by this rule:

* a wildcard (``N/A``, ``simulated``, ``*``, ``any`` or empty; mplang's defaults are
  ``N/A`` and ``simulated``) asks for nothing;
* otherwise the asked text must equal what the worker runs, or be a prefix of it ending at
  a ``.``, ``-``, ``_`` or ``+`` (case-insensitive): ``0.1`` is served by ``0.1.0``,
  ``linux`` by ``linux-x86_64``; ``0.2`` and ``darwin`` are not.

What a worker runs is either of two: its own (mpl's version, and ``<os>-<machine>`` such as
``linux-x86_64``), or what its node declares in the cluster spec the worker joined with (the
parties' agreed spec: a session whose spec copies it is always served).

Pure functions, no I/O.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from typing import Any

from mpl.wire.limits import MAX_RUNTIME_INFO_ITEMS, MAX_RUNTIME_INFO_TEXT

__all__ = [
    "MPL_VERSION",
    "WILDCARDS",
    "incompatibility",
    "info_weight",
    "matches",
    "node_runtime_info",
    "oversize",
    "own_runtime",
]

MPL_VERSION = "0.1.0"  # pyproject.toml's version (a test keeps the two equal)
WILDCARDS = frozenset({"", "n/a", "simulated", "*", "any"})
_SEPARATORS = ".-_+"
_CHECKED = ("version", "platform")


def own_runtime() -> dict[str, str]:
    """What this process runs: ``{"version": mpl's version, "platform": "<os>-<machine>"}``.
    The version is the code's own (:data:`MPL_VERSION`), not the installed package's
    metadata: a package upgraded under a running worker does not change what it runs."""
    return {"version": MPL_VERSION, "platform": f"{sys.platform}-{platform.machine()}".lower()}


def matches(asked: str, have: str) -> bool:
    """True when a node running ``have`` serves a session asking for ``asked`` (see above)."""
    want, got = asked.strip().lower(), have.strip().lower()
    if want in WILDCARDS:
        return True
    if got == want:
        return True
    return got.startswith(want) and got[len(want)] in _SEPARATORS


def incompatibility(asked: Mapping[str, Any], *runs: Mapping[str, Any]) -> str | None:
    """Why a worker that runs any of ``runs`` cannot serve ``asked``, or None if it can."""
    for key in _CHECKED:
        want = str(asked.get(key, "N/A"))
        offers = [str(r.get(key, "")) for r in runs]
        if not any(matches(want, have) for have in offers):
            shown = " or ".join(repr(o) for o in dict.fromkeys(offers) if o)
            return (
                f"runtime_info.{key} {want!r} is not served here: this node runs {shown} "
                f"(a prefix such as {offers[0].split('.')[0]!r}, or N/A for any, would match)"
            )
    return None


def oversize(info: Any) -> str | None:
    """Why ``info`` (a node's runtime_info, from a driver) is too big, or None.

    It holds text, numbers, booleans, None, lists and maps only, what a spec's YAML or
    JSON gives: anything else (an array, a set, an undecoded buffer) would count as one
    item whatever its size, past this bound and both budgets weighed as
    :func:`info_weight` does. An integer's bytes count as text."""
    items = text = 0
    stack: list[tuple[Any, int]] = [(info, 0)]
    while stack:
        value, depth = stack.pop()
        items += 1
        if items > MAX_RUNTIME_INFO_ITEMS:
            return f"more than {MAX_RUNTIME_INFO_ITEMS} keys and values"
        if depth > 16:
            return "nested more than 16 deep"
        if value is None or isinstance(value, (bool, float)):
            continue
        if isinstance(value, (str, bytes, int)):
            text += _text_size(value)
            if text > MAX_RUNTIME_INFO_TEXT:
                return f"more than {MAX_RUNTIME_INFO_TEXT} characters of text"
        elif isinstance(value, Mapping):
            stack.extend((k, depth + 1) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)
        else:
            return (
                f"a value of type {type(value).__name__}: runtime_info holds text, numbers, "
                "booleans, None, lists and maps"
            )
    return None


def _text_size(value: str | bytes | int) -> int:
    """What a text or number counts as text: its characters, or an integer's bytes."""
    if isinstance(value, int):
        return (value.bit_length() + 7) // 8
    return len(value)


def info_weight(info: Any) -> int:
    """What keeping ``info`` (a runtime_info :func:`oversize` passed) counts against
    ``MAX_RUNTIME_INFO_TOTAL``: its characters of text, and 64 for each key, value and
    container entry (what a small object costs in memory, about)."""
    weight = 0
    stack: list[Any] = [info]
    while stack:
        value = stack.pop()
        weight += _ITEM_WEIGHT
        if isinstance(value, (str, bytes, int)):
            weight += _text_size(value)
        elif isinstance(value, Mapping):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return weight


_ITEM_WEIGHT = 64


def node_runtime_info(cluster: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """Node ``rank``'s ``runtime_info`` in a cluster spec's dict form ({} when absent)."""
    nodes = cluster.get("nodes") or []
    if not 0 <= rank < len(nodes):
        return {}
    info = nodes[rank].get("runtime_info") or {}
    return dict(info) if isinstance(info, Mapping) else {}
