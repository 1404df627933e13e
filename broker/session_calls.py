"""Sessions opened and closed: a driver's ``OpenSession`` (or attach) and
``CloseSession``, and the end of a session for any reason (its jobs aborted, every worker
told). No I/O.

Who may open, attach to or close a session is :mod:`mpl.broker.access`'s to say; the
table of sessions is :mod:`mpl.broker.sessions`. A small class over
:class:`~mpl.broker.state.BrokerState`, as its other families of handlers are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpl.broker.actions import Send
from mpl.broker.admission import refuse_open
from mpl.broker.sessions import session_spec
from mpl.wire.incarnation import public_incarnation
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import CloseSession, OpenSession, Reply, SessionClosed, SessionOpened

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["SessionCalls"]


class SessionCalls:
    """The session handlers of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state

    def on_open(
        self, peer: bytes, msg: OpenSession, now: float, who: str | None = None
    ) -> list[Send]:
        state = self.state
        identity = state.access.driver(peer, who)
        if peer in state.registry.by_peer or identity is None:
            return [state._refuse(peer, "ProtocolError", "a worker cannot open a session")]
        if (refusal := refuse_open(msg.lease_s, len(state.sessions.by_id), msg.name)) is not None:
            return [Send(peer, state._req_error(msg.req, "SessionError", refusal))]
        shared, error = state.access.opening(identity, msg)
        if error is not None:
            return [Send(peer, Reply(msg.req, error=error))]
        existing = state.sessions.named(msg.name)
        spec, error = session_spec(state.cluster, existing, msg.cluster)
        if error is not None:
            return [Send(peer, Reply(msg.req, error=error))]
        spec_key: object = None
        if spec is not None and existing is None:  # kept within the budget over all sessions
            kept = state.sessions.specs.keep(spec, identity)
            if isinstance(kept, str):
                return [Send(peer, Reply(msg.req, error=ErrorInfo("ClusterSpecError", kept)))]
            spec, spec_key = kept
        entry, attached = state.sessions.open(identity, msg.client, msg.name, msg.lease_s, now)
        if shared is not None:
            entry.shared = shared
        if not attached:
            entry.cluster = spec
            entry.spec_key = spec_key
        cluster = entry.cluster or state.cluster.to_dict()
        # each live worker's public incarnation: what a secure driver binds its Execs to
        incarnations = {
            r: public_incarnation(e.hello.incarnation) for r, e in state.registry.by_rank.items()
        }
        opened = SessionOpened(
            msg.req,
            entry.sid,
            state.broker_id,
            cluster,
            state.heartbeat_s,
            attached,
            incarnations,
            state.max_message,
        )
        if not attached and spec is not None:  # its nodes' workers accept it first
            return state.runtimes.announce(peer, entry, msg.cluster or {}, opened)
        return [Send(peer, opened)]

    def on_close(
        self, peer: bytes, msg: CloseSession, now: float, who: str | None = None
    ) -> list[Send]:
        state = self.state
        session = state.access.session(peer, who, msg.session)
        if isinstance(session, ErrorInfo):
            state._note(f"ignored a close of session {msg.session}: {session.message}")
            return []
        if state.sessions.detach(msg.client, msg.session):
            return self.close_session(msg.session, "closed by its driver")
        return []

    def close_session(self, sid: str, reason: str) -> list[Send]:
        state = self.state
        entry = state.sessions.remove(sid)
        if entry is None:
            return []
        out: list[Send] = []
        info = ErrorInfo("JobAbortedError", f"session {sid} closed: {reason}")
        for job in state.calls.of_session(sid):
            out += state._fail_call(job, info)
        closed = SessionClosed(sid, reason)
        out += [Send(p, closed) for p in state.registry.by_peer]
        return out
