"""Who may do what: the broker's checks of a message against who really sent it.

Identities, never fields the sender wrote:

* ``who`` is what the ZAP handler stamped on the message in secure mode (``node:<name>``
  from a node's key, ``driver:<name>`` from a driver's); ``None`` in plaintext mode, where
  a driver is the name its routing id declares (:mod:`mpl.wire.routing`) and a worker is
  the socket that registered its rank.
* A worker speaks only for its own rank: an answer counts only from the socket (or result
  channel) registered for the rank it names, in secure mode only with that node's key.
* A session belongs to the driver identity that opened it and the identities it shares it
  with; a ``sym:`` value is read only once saved in or loaded into the reading session.

Pure decisions, no I/O: :class:`~mpl.broker.state.BrokerState` asks and acts on the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpl.broker.registry import Registry
from mpl.broker.sessions import SessionEntry, SessionTable
from mpl.wire.cluster import ClusterSpec
from mpl.wire.identity import DRIVER_PREFIX, driver_identity, node_identity
from mpl.wire.remote import ErrorInfo
from mpl.wire.routing import check_driver_name, plaintext_identity
from mpl.wire.sessions import OpenSession

__all__ = ["MAX_CLIENTS", "MAX_OWNED", "MAX_SHARE", "Access"]

MAX_SHARE = 64  # identities one session may be shared with
MAX_OWNED = 256  # sessions one driver identity may hold open at once
MAX_CLIENTS = 1024  # driver clients attached to one session at once


_LOOK_UP: Any = object()  # speaks_for: the caller did not look the worker up


class Access:
    """The checks, over the broker's registry and sessions; refusals are counted in
    ``counters`` (``forged_replies``, ``refused_requests``) and described through ``note``."""

    def __init__(
        self,
        cluster: ClusterSpec,
        registry: Registry,
        sessions: SessionTable,
        counters: dict[str, int],
        note: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        # node identity -> rank: who speaks for which rank, one lookup per message (the
        # broker's spec is fixed for its life; read by the hot Done's check too)
        self.node_rank = {node_identity(n.name): n.rank for n in cluster.nodes}
        self.registry = registry
        self.sessions = sessions
        self.counters = counters
        self.note = note
        counters.setdefault("forged_replies", 0)
        counters.setdefault("refused_requests", 0)

    # -- drivers and sessions -------------------------------------------------------------
    def driver(self, peer: bytes, who: str | None) -> str | None:
        """The driver identity of a message's sender; None when it is not a driver."""
        if who is None:
            return plaintext_identity(peer)
        return who if who.startswith(DRIVER_PREFIX) else None  # a driver's key's identity

    def session(
        self, peer: bytes, who: str | None, sid: str, now: float | None = None
    ) -> SessionEntry | ErrorInfo:
        """Session ``sid`` if the sender may act in it (renewing its lease when ``now`` is
        given), else the error to answer with."""
        return self.session_of(self.driver(peer, who), who, sid, now)

    def session_of(
        self, identity: str | None, who: str | None, sid: str, now: float | None = None
    ) -> SessionEntry | ErrorInfo:
        """:meth:`session` for a sender whose driver identity (``self.driver(peer, who)``)
        the caller has already worked out."""
        session = self.sessions.get(sid)
        if session is None:
            return no_session(sid)
        if identity is None or not session.allows(identity):
            return self.denied(session, identity or str(who))
        if now is not None:
            session.last_seen = now
        return session

    def opening(
        self, identity: str, msg: OpenSession
    ) -> tuple[frozenset[str] | None, ErrorInfo | None]:
        """May ``identity`` open (or attach to) the session ``msg`` names? Returns the
        identities to share it with (None: leave as is), or the error to answer with."""
        shared: frozenset[str] | None = None
        if msg.share_with is not None:
            try:
                shared = frozenset(driver_identity(check_driver_name(n)) for n in msg.share_with)
            except ValueError as exc:
                return None, ErrorInfo("SessionError", str(exc))
            if len(shared) > MAX_SHARE:
                return None, ErrorInfo(
                    "SessionError", f"a session is shared with at most {MAX_SHARE} drivers"
                )
        existing = self.sessions.named(msg.name)
        if existing is None:
            if self.sessions.owned_by(identity) >= MAX_OWNED:
                return None, ErrorInfo(
                    "SessionError",
                    f"{identity} already holds {MAX_OWNED} open sessions: close some first "
                    "(mp.close_session or ctx.close())",
                )
            return shared, None
        if not existing.allows(identity):
            return None, self.denied(existing, identity)
        if shared is not None and identity != existing.owner:
            return None, self.denied(existing, identity, "change who shares")
        if msg.client not in existing.clients and len(existing.clients) >= MAX_CLIENTS:
            return None, ErrorInfo(
                "SessionError", f"session {msg.name!r} already has {MAX_CLIENTS} clients attached"
            )
        return shared, None

    def denied(self, session: SessionEntry, identity: str, what: str = "use") -> ErrorInfo:
        self.counters["refused_requests"] += 1
        label = f"{session.sid} ({session.name!r})" if session.name else session.sid
        message = (
            f"{identity} may not {what} session {label}: only the driver that opened it, "
            "and the drivers it shares it with, may"
        )
        if what != "use":
            message = f"{identity} may not {what} session {label}: only its owner may"
        self.note(message)
        return ErrorInfo("SessionAccessError", message)

    def unloaded(self, session: SessionEntry, uri: str) -> ErrorInfo:
        self.counters["refused_requests"] += 1
        message = (
            f"{uri!r} is not a value of session {session.sid}: persisted values are read "
            f"only after mp.load({uri[4:]!r}) in the reading session"
        )
        self.note(message)
        return ErrorInfo("SessionAccessError", message)

    def unreadable_binding(self, session: SessionEntry, bindings: dict[int, Any]) -> str | None:
        """The first store reference among a job's inputs this session may not read."""
        for bound in bindings.values():
            for uri in bound if isinstance(bound, list) else ():
                if isinstance(uri, str) and not session.may_read(uri):
                    return uri
        return None

    # -- workers --------------------------------------------------------------------------
    def speaks_for(
        self, peer: bytes, who: str | None, rank: int, tag: str, entry: Any = _LOOK_UP
    ) -> bool:
        """True when ``peer`` is the socket (or result channel) registered for ``rank`` and,
        in secure mode, ``who`` is that rank's node; else the message is dropped, counted.
        ``entry``: ``registry.worker(peer)``, when the caller has looked it up already."""
        if entry is _LOOK_UP:
            entry = self.registry.worker(peer)
        if (
            entry is not None
            and entry.rank == rank
            and self.registry.by_rank.get(rank) is entry
            and (who is None or self.node_rank.get(who) == rank)
        ):
            return True
        claimed = f"rank {entry.rank}" if entry is not None else "an unregistered peer"
        self.forged(f"{tag!r} for rank {rank} from {claimed} ({who or 'plaintext'})")
        return False

    def channel_key_ok(self, who: str | None, rank: int) -> bool:
        """In secure mode, a result channel for ``rank`` comes with node ``rank``'s key."""
        return who is None or self.node_rank.get(who) == rank

    def forged(self, what: str) -> None:
        self.counters["forged_replies"] += 1
        self.note(f"dropped {what}")


def no_session(sid: str) -> ErrorInfo:
    return ErrorInfo(
        "SessionError",
        f"unknown session {sid!r}: it was closed, its lease expired, or the broker restarted",
    )
