"""Listing and admin: ``mp.sessions()``, ``mp.symbols()``, ``mp.programs()`` and
``mp.close_session(name)``, answered from the broker's tables.

The access rules of :mod:`mpl.broker.access` hold here as everywhere: a caller sees the
sessions it owns or shares in full and the others only as a count; a session's names
only when it may act in that session; the programs cached for its own identity only.
Persisted names are listed per party; in secure mode each only to the driver that owns it
(:mod:`mpl.broker.persisted`), in plaintext to every driver (no one is authenticated).
Closing a session by name is for its owner alone, from any of the owner's drivers.
"""

from __future__ import annotations

import re
from math import prod
from typing import TYPE_CHECKING, Any

from mpl.broker.actions import Send
from mpl.broker.sessions import SessionEntry
from mpl.wire.printable import one_line
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import CloseNamed, ListRequest, Reply, SymbolInfo

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["Listing", "format_rows", "session_rows", "size_of"]

_DESCRIBED = re.compile(r"^([a-z]+)(\d*)\[([\d, ]*)\]$")  # what workers report: float64[3, 2]


def size_of(meta: str) -> int | None:
    """Bytes of an array described as ``float64[3, 2]`` (``bool[4]``), else None."""
    match = _DESCRIBED.match(meta)
    if match is None:
        return None
    kind, bits, dims = match.groups()
    if bits:
        item = int(bits) // 8
    elif kind == "bool":
        item = 1
    else:
        return None
    shape = [int(d) for d in dims.split(",") if d.strip()]
    return item * prod(shape)


def session_rows(
    sessions: list[SessionEntry], now: float, viewer: str | None = None
) -> list[dict[str, Any]]:
    """One row per session, for a viewer allowed to see it in full (with the runtime_info
    of each node its own spec named)."""
    return [
        {
            "session": s.sid,
            "name": s.name,
            "owner": s.owner,
            "mine": viewer is not None and s.owner == viewer,
            "shared_with": sorted(s.shared),
            "drivers": len(s.clients),
            "idle_s": now - s.last_seen,
            "lease_s": s.lease_s,
            "symbols": len(s.symbols),
            "jobs": len(s.jobs),
            "runtime_info": _runtime_info(s),
        }
        for s in sessions
    ]


def _runtime_info(session: SessionEntry) -> dict[str, Any]:
    """Node name -> runtime_info, for the nodes the session's own spec named ({}: the
    session runs on the cluster's spec, and its nodes' runtime_info is the cluster's)."""
    nodes = (session.cluster or {}).get("nodes") or []
    return {
        n["name"]: dict(n.get("runtime_info") or {})
        for n in nodes
        if n.get("name") in session.named_nodes
    }


def _symbol_row(info: SymbolInfo) -> dict[str, Any]:
    meta = str(info.meta.get("meta", "")) if isinstance(info.meta, dict) else ""
    return {
        "name": info.name,
        "device": info.device,
        "parties": list(info.ranks),
        "persist": info.persist,
        "meta": meta,
        "size_bytes": size_of(meta),
    }


class Listing:
    """The listing and admin handlers of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state

    def on_list(
        self, peer: bytes, msg: ListRequest, now: float, who: str | None = None
    ) -> list[Send]:
        identity = self.state.access.driver(peer, who) or ""
        if msg.what == "sessions":
            return [Send(peer, Reply(msg.req, value=self.sessions(identity, now)))]
        if msg.what == "programs":
            return [Send(peer, Reply(msg.req, value=self.programs(identity, now)))]
        if msg.what == "symbols":
            own: list[dict[str, Any]] = []
            if msg.session:
                session = self.state.access.session(peer, who, msg.session, now)
                if isinstance(session, ErrorInfo):
                    return [Send(peer, Reply(msg.req, error=session))]
                own = [_symbol_row(i) for _, i in sorted(session.symbols.items())]
            value = {"session": own, "persisted": self.persisted(self.viewer(identity))}
            return [Send(peer, Reply(msg.req, value=value))]
        error = ErrorInfo("ProtocolError", f"unknown listing {msg.what!r}")
        return [Send(peer, Reply(msg.req, error=error))]

    def sessions(self, identity: str, now: float) -> dict[str, Any]:
        every = list(self.state.sessions.by_id.values())
        mine = [s for s in every if s.allows(identity)]
        return {"sessions": session_rows(mine, now, identity), "others": len(every) - len(mine)}

    def viewer(self, identity: str) -> str | None:
        """Whose persisted names ``identity`` may list: its own in secure mode (``""``, no
        driver: none), every one in plaintext (None)."""
        return identity if self.state.secure else None

    def persisted(self, viewer: str | None = None) -> list[dict[str, Any]]:
        """One row per party holding a persisted name ``viewer`` may list (None: all)."""
        return [
            {**_symbol_row(info), "rank": rank}
            for _, rank, info in self.state.persisted.listed(viewer)
        ]

    def programs(self, identity: str, now: float) -> list[dict[str, Any]]:
        """The caller's cached programs, most recently used first, with the seconds since
        each was last sent or run (a sealed program's graph is not readable here: its ops
        and ranks are unknown to the broker)."""
        rows = []
        for (owner, digest), program in reversed(self.state.programs.items()):
            if owner != identity:
                continue
            graph = program.graph
            rows.append(
                {
                    "digest": digest,
                    "name": graph.name if graph is not None else "",
                    "ops": len(graph.ops) if graph is not None else None,
                    "ranks": list(graph.ranks) if graph is not None else None,
                    "sealed": graph is None,
                    "idle_s": now - used
                    if (used := self.state.program_used.get((owner, digest))) is not None
                    else None,
                }
            )
        return rows

    def on_close_named(
        self, peer: bytes, msg: CloseNamed, now: float, who: str | None = None
    ) -> list[Send]:
        identity = self.state.access.driver(peer, who) or ""
        session = self.state.sessions.named(msg.name)
        if session is None:
            error = ErrorInfo("SessionError", f"no open session named {msg.name!r}")
            return [Send(peer, Reply(msg.req, error=error))]
        if identity != session.owner:
            return [
                Send(
                    peer, Reply(msg.req, error=self.state.access.denied(session, identity, "close"))
                )
            ]
        out = self.state.session_calls.close_session(
            session.sid, f"closed by its owner ({identity})"
        )
        return [Send(peer, Reply(msg.req)), *out]


def format_rows(rows: list[dict[str, Any]], columns: tuple[str, ...], empty: str) -> str:
    """A plain text table of ``rows`` (for ``mpl-broker status --sessions/--symbols``)."""
    if not rows:
        return empty
    cells = [[_text(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _text(value: Any) -> str:
    # a cell may be a party's word (a persisted name's device and meta, from its worker's
    # hello): on one line, its control characters escaped (wire/printable.py)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list):
        return one_line(",".join(map(str, value))) or "-"
    return one_line(value)
