"""Sessions: which driver clients are attached, their leases, and the names saved in each.

A session stays open while some message for it arrives (a job, a fetch, or a driver's
heartbeat naming it) at least once per lease. A client detaches with ``CloseSession``; the
session closes when its last client has detached, or when its lease runs out.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from mpl.wire.sessions import SymbolInfo

__all__ = ["SessionEntry", "SessionTable"]


@dataclass
class SessionEntry:
    sid: str
    name: str
    lease_s: float
    last_seen: float
    clients: set[str] = field(default_factory=set)
    symbols: dict[str, SymbolInfo] = field(default_factory=dict)
    jobs: set[str] = field(default_factory=set)


class SessionTable:
    """Open sessions by id and by name."""

    def __init__(self) -> None:
        self.by_id: dict[str, SessionEntry] = {}
        self.by_name: dict[str, str] = {}

    def open(self, client: str, name: str, lease_s: float, now: float) -> tuple[SessionEntry, bool]:
        """Create a session, or attach ``client`` to the named one. Returns (entry, attached)."""
        sid = self.by_name.get(name) if name else None
        attached = sid is not None
        if sid is None:
            sid = f"s{secrets.token_hex(6)}"
            self.by_id[sid] = SessionEntry(sid, name, lease_s, now)
            if name:
                self.by_name[name] = sid
        entry = self.by_id[sid]
        entry.clients.add(client)
        entry.last_seen = now
        if attached:
            entry.lease_s = max(entry.lease_s, lease_s)
        return entry, attached

    def get(self, sid: str, now: float | None = None) -> SessionEntry | None:
        """The session ``sid``; passing ``now`` renews its lease."""
        entry = self.by_id.get(sid)
        if entry is not None and now is not None:
            entry.last_seen = now
        return entry

    def detach(self, client: str, sid: str) -> bool:
        """Detach ``client``; True when no client is left (the session should close)."""
        entry = self.by_id.get(sid)
        if entry is None:
            return False
        entry.clients.discard(client)
        return not entry.clients

    def expired(self, now: float) -> list[SessionEntry]:
        return [s for s in self.by_id.values() if now - s.last_seen > s.lease_s]

    def remove(self, sid: str) -> SessionEntry | None:
        entry = self.by_id.pop(sid, None)
        if entry is not None and entry.name and self.by_name.get(entry.name) == sid:
            del self.by_name[entry.name]
        return entry
