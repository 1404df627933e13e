"""The status report the broker answers ``StatusRequest`` with, for one viewer.

In plaintext mode (loopback only) the asker sees everything: it is the operator's tool. In
secure mode the asker is a driver identity, and another driver's sessions are not its
business: it sees its own sessions (those it owns or shares) in full, the others only as a
count, no recent errors (they quote other drivers' failures; the broker's log has them),
and only the persisted names it owns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpl.broker.listing import session_rows
from mpl.broker.presence import MAX_REASON_CHARS
from mpl.wire.incarnation import public_incarnation

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["anonymous", "anonymous_ledger", "build_status"]

_NAMING = ("session", "job")  # what names a recent job of the ledger (JobSpan.to_dict)


def _rank_rows(state: BrokerState, now: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for rank in range(state.cluster.world_size):
        entry = state.registry.by_rank.get(rank)
        if entry is not None:
            rows.append(
                {
                    "rank": rank,
                    "state": "up",
                    "pid": entry.hello.pid,
                    "host": entry.hello.host[:MAX_REASON_CHARS],  # the worker's word
                    "heartbeat_age_s": now - entry.last_seen,
                    **entry.stats,
                    # what a secure driver binds its Execs for this rank to (after the
                    # worker's own stats: the registry's word, not the worker's)
                    "incarnation": public_incarnation(entry.hello.incarnation),
                }
            )
            continue
        lost = state.registry.lost.get(rank)
        rows.append(
            {
                "rank": rank,
                "state": "lost" if lost else "absent",
                "pid": lost.hello.pid if lost else "",
                "host": lost.hello.host[:MAX_REASON_CHARS] if lost else "",
                "heartbeat_age_s": None,
                "reason": lost.reason if lost else "",
            }
        )
    return rows


def build_status(state: BrokerState, now: float, viewer: str | None = None) -> dict[str, Any]:
    """The status dict; ``viewer`` None is the full (plaintext) view."""
    visible = [s for s in state.sessions.by_id.values() if viewer is None or s.allows(viewer)]
    sessions = session_rows(visible, now, viewer)
    return {
        "broker_id": state.broker_id,
        "uptime_s": now - state.started,
        "world_size": state.cluster.world_size,
        "cluster_id": state.cluster.cluster_id,
        "ranks": _rank_rows(state, now),
        "sessions": sessions,
        "other_sessions": len(state.sessions.by_id) - len(visible),
        "jobs_in_flight": len(state.calls.jobs),
        "persisted_symbols": state.persisted.names(viewer),  # in secure mode its own
        "errors": list(state.errors) if viewer is None else [],
        **state.counters,
    }


def anonymous(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` for a viewer nobody authenticated (the status page and ``/status.json``
    of a secure broker): every session only counted, no recent errors, no names (its
    ledger: :func:`anonymous_ledger`)."""
    out = dict(status)
    out["other_sessions"] = status.get("other_sessions", 0) + len(status.get("sessions", []))
    out["sessions"] = []
    out["errors"] = []
    out["persisted_symbols"] = []
    return out


def anonymous_ledger(ledger: dict[str, Any]) -> dict[str, Any]:
    """The job ledger's snapshot (``JobLedger.snapshot``) for a viewer nobody authenticated:
    its counts, and each recent job's outcome and timings, but not which session and job it
    was (a session's id is its name and its owner's tag: drivers' business)."""
    recent = [
        {key: value for key, value in job.items() if key not in _NAMING}
        for job in ledger.get("recent", [])
    ]
    return {**ledger, "recent": recent}
