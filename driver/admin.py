"""Listing and admin: ``mp.sessions()``, ``mp.symbols()``, ``mp.programs()`` and
``mp.close_session(name)``.

The broker answers from its tables and applies the access rules: a driver sees the
sessions it owns or shares in full and only a count of the others, a session's names only
in a session it may act in, and its own cached programs only.
"""

from __future__ import annotations

from typing import Any

from mpl.driver.context import Context, current
from mpl.wire.errors import ProtocolError

__all__ = ["close_session", "programs", "sessions", "symbols"]


def _ctx(ctx: Context | None) -> Context:
    return ctx if ctx is not None else current()


def sessions(ctx: Context | None = None) -> dict[str, Any]:
    """``{"sessions": [...], "others": n}``: one row per session the caller may see (id,
    name, owner, ``mine``, ``shared_with``, attached ``drivers``, ``idle_s``, ``lease_s``,
    counts of ``symbols`` and ``jobs``, and ``runtime_info``: node name -> runtime_info for
    the nodes a session's own spec named, ``{}`` on the cluster's spec), and how many other
    sessions are open."""
    return _dict(_ctx(ctx).client.listing("sessions"))


def symbols(ctx: Context | None = None) -> dict[str, Any]:
    """``{"session": [...], "persisted": [...]}``: the names of the current session, and
    every persisted name with the rank holding it (one row per party: each party persists
    under its own namespace). A row has ``name``, ``device``, ``parties``, ``persist``,
    ``meta`` (``float64[3]``) and ``size_bytes`` (for arrays, else None)."""
    c = _ctx(ctx)
    return _dict(c.client.listing("symbols", c.session))


def programs(ctx: Context | None = None) -> list[dict[str, Any]]:
    """The programs the broker caches for this driver, most recently used first: ``digest``,
    ``name``, ``ops`` and ``ranks`` (None when sealed: a secure broker cannot read them), and
    ``idle_s``, the seconds since the program was last sent or run."""
    rows = _ctx(ctx).client.listing("programs")
    if not isinstance(rows, list):
        raise ProtocolError("the broker answered a programs listing with something else")
    return rows


def close_session(name: str, ctx: Context | None = None) -> None:
    """Close the session called ``name``, which this driver owns, for every driver attached
    to it (also from another connection of the same driver): its values are freed on the
    workers and its jobs in flight fail. Others get ``SessionAccessError``."""
    _ctx(ctx).client.close_named(name)


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("the broker answered a listing with something else")
    return value
