"""Which requests the broker refuses before taking them on: the bounds of
``mpl.wire.limits`` applied to its tables. Pure functions; each returns why, or None."""

from __future__ import annotations

from typing import Any

from mpl.broker.calls import CallTable
from mpl.wire.limits import MAX_CALLS, MAX_SESSION_SYMBOLS, MAX_SESSIONS, check_lease, check_ranks
from mpl.wire.sessions import SymbolInfo

__all__ = ["MAX_SESSION_NAME", "refuse_call", "refuse_open", "refuse_save"]

# A named session's id is its name (its driver checks the broker's answer against it), sent
# in every job to every worker and kept in their bindings: so bounded.
MAX_SESSION_NAME = 128


def refuse_open(lease_s: float, open_sessions: int, name: Any = "") -> str | None:
    """A session with a lease outside (0, 1 day], a name that is not a string of at most
    ``MAX_SESSION_NAME`` characters, or one session more than ``MAX_SESSIONS``."""
    if (why := check_lease(lease_s)) is not None:
        return why
    if type(name) is not str or len(name) > MAX_SESSION_NAME:
        return f"a session's name is a string of at most {MAX_SESSION_NAME} characters"
    if open_sessions >= MAX_SESSIONS:
        return f"the broker holds {MAX_SESSIONS} sessions already: close some first"
    return None


def refuse_call(calls: CallTable) -> str | None:
    """A call beyond ``MAX_CALLS`` in flight."""
    if len(calls.jobs) + len(calls.requests) < MAX_CALLS:
        return None
    return f"the broker has {MAX_CALLS} calls in flight: wait for some to finish"


def refuse_save(info: SymbolInfo, symbols: dict[str, Any]) -> str | None:
    """A save naming no rank, or a new name beyond ``MAX_SESSION_SYMBOLS`` in a session."""
    if (why := check_ranks(info.ranks, f"saving {info.name!r}")) is not None:
        return why
    full = len(symbols) >= MAX_SESSION_SYMBOLS
    if full and not info.persist and info.name not in symbols:
        return f"the session holds {MAX_SESSION_SYMBOLS} names already: delete some"
    return None
