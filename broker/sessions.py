"""Sessions: who owns each, which driver clients are attached, leases, and saved names.

A session belongs to the driver identity that opened it (``driver:<name>``: the key's name
in secure mode, the declared name in plaintext mode, see :mod:`mpl.wire.routing`). Only the
owner and the identities it shares the session with may attach to it or act in it.

A session stays open while some message for it arrives (a job, a fetch, or a driver's
heartbeat naming it) at least once per lease. A client detaches with ``CloseSession``; the
session closes when its last client has detached, or when its lease runs out.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from mpl.broker.session_specs import SessionSpecs
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import ClusterSpecError
from mpl.wire.remote import ErrorInfo
from mpl.wire.session_cluster import session_cluster
from mpl.wire.session_word import session_id
from mpl.wire.sessions import SymbolInfo

__all__ = ["SessionEntry", "SessionTable", "session_spec"]


@dataclass
class SessionEntry:
    sid: str
    name: str
    lease_s: float
    last_seen: float
    owner: str = ""  # the driver identity that opened it
    shared: frozenset[str] = frozenset()  # other driver identities the owner let in
    clients: set[str] = field(default_factory=set)
    symbols: dict[str, SymbolInfo] = field(default_factory=dict)
    loaded: set[str] = field(default_factory=set)  # persisted names loaded into it
    jobs: set[str] = field(default_factory=set)
    cluster: dict[str, Any] | None = None  # its own spec (dict form); None: the broker's
    named_nodes: frozenset[str] = frozenset()  # the nodes its own spec named
    spec_key: object = None  # its own spec's key in the table's SessionSpecs

    def allows(self, identity: str) -> bool:
        """True when the driver ``identity`` may attach to and act in this session."""
        return identity == self.owner or identity in self.shared

    def may_read(self, uri: str) -> bool:
        """True unless ``uri`` names a value (``sym:<name>``) not saved in or loaded into
        this session: persisted values are reached only through a load."""
        if not uri.startswith("sym:"):
            return True
        name = uri[4:]
        return name in self.symbols or name in self.loaded


class SessionTable:
    """Open sessions by id and by name."""

    def __init__(self, drivers: int = 0) -> None:
        self.by_id: dict[str, SessionEntry] = {}
        self.by_name: dict[str, str] = {}
        # open sessions' own specs, within one budget (``drivers``: listed drivers, each
        # its share; 0 in plaintext, whose driver names are anyone's to take)
        self.specs = SessionSpecs(drivers=drivers)

    def named(self, name: str) -> SessionEntry | None:
        sid = self.by_name.get(name) if name else None
        return self.by_id.get(sid) if sid is not None else None

    def open(
        self, owner: str, client: str, name: str, lease_s: float, now: float
    ) -> tuple[SessionEntry, bool]:
        """Create a session owned by ``owner``, or attach ``client`` to the named one (the
        caller checks first that ``owner`` may). Returns (entry, attached).

        A new session's id is ``<name>~<8 random characters><16 naming its owner>``
        (base64url, ``mpl.wire.session_word.session_id``): the driver, which chooses the name
        (a fresh random one for a session of its own), checks that the id it is answered
        with is one of that name's, and of its own when it opened it (``mpl.driver.client``);
        the random part keeps each opening's id new, as workers remember closed sessions by
        id; the owner's part lets no other driver bind the id on a worker
        (``mpl.worker.admission``). An unnamed open (an older driver) is named
        ``s<16 random hex digits>``."""
        entry = self.named(name)
        attached = entry is not None
        if entry is None:
            sid = ""
            while not sid or sid in self.by_id:
                sid = session_id(name or f"s{secrets.token_hex(8)}", owner)
            entry = self.by_id[sid] = SessionEntry(sid, name, lease_s, now, owner=owner)
            if name:
                self.by_name[name] = sid
        entry.clients.add(client)
        entry.last_seen = now
        if attached:
            entry.lease_s = max(entry.lease_s, lease_s)
        return entry, attached

    def owned_by(self, owner: str) -> int:
        return sum(1 for s in self.by_id.values() if s.owner == owner)

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
        if entry is None:
            return None
        if entry.name and self.by_name.get(entry.name) == sid:
            del self.by_name[entry.name]
        if entry.spec_key is not None:
            self.specs.release(entry.spec_key, entry.owner)
        return entry


def session_spec(
    broker: ClusterSpec, existing: SessionEntry | None, requested: Any
) -> tuple[dict[str, Any] | None, ErrorInfo | None]:
    """The spec (dict form) a session opened with ``requested`` runs on (None: the
    broker's), or the error to answer with. Attaching to an open session keeps its spec:
    asking for another one is refused."""
    if requested is None:
        return None, None
    try:
        spec = session_cluster(broker, requested).to_dict()
    except ClusterSpecError as exc:
        return None, ErrorInfo("ClusterSpecError", f"the session's cluster spec: {exc}")
    if existing is not None and (existing.cluster or broker.to_dict()) != spec:
        return None, ErrorInfo(
            "SessionError",
            f"session {existing.name!r} is open on another cluster spec: attach without "
            "cluster=, or with the same spec",
        )
    return spec, None
