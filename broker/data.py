"""Data requests between a driver and a worker: fetches (and their replies) and deletes.

A ``Fetch`` is forwarded to the one rank that holds the value, for a session the caller may
use and a value it may read; the ``Reply`` counts only from that rank (its registered
socket, or its key in secure mode) and goes back to the driver that asked. ``Delete`` has no
answer: it is forwarded per rank, or dropped when the session is gone or not the caller's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpl.broker.actions import Send
from mpl.broker.admission import refuse_call
from mpl.broker.calls import RequestCall
from mpl.wire.data import Delete, Fetch
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import Reply

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["DataCalls"]


class DataCalls:
    """The data handlers of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state

    def on_fetch(self, peer: bytes, msg: Fetch, now: float, who: str | None = None) -> list[Send]:
        session = self.state.access.session(peer, who, msg.session, now)
        if isinstance(session, ErrorInfo):
            return [Send(peer, Reply(msg.req, error=session))]
        if not session.may_read(msg.uri):
            return [Send(peer, Reply(msg.req, error=self.state.access.unloaded(session, msg.uri)))]
        entry = self.state.registry.by_rank.get(msg.rank)
        if entry is None:
            return [Send(peer, Reply(msg.req, error=self.state._absent(msg.rank)))]
        if (busy := refuse_call(self.state.calls)) is not None:
            return [Send(peer, self.state._req_error(msg.req, "ProtocolError", busy))]
        bid = self.state.calls.new_req()
        self.state.calls.requests[bid] = RequestCall(
            peer, msg.session, (msg.rank,), {msg.rank}, req=msg.req, bid=bid, kind="fetch"
        )
        forward = Fetch(msg.session, bid, msg.rank, msg.uri, msg.reply_to, msg.ticket)
        return [Send(entry.peer, forward)]

    def on_worker_reply(
        self, peer: bytes, msg: Reply, now: float, who: str | None = None
    ) -> list[Send]:
        worker = self.state.registry.worker(peer)
        rank = worker.rank if worker is not None else -1
        if not self.state.access.speaks_for(peer, who, rank, msg.TAG):
            return []
        call = self.state.calls.requests.get(msg.req)
        if call is None or call.kind != "fetch":
            return []
        if rank not in call.pending:
            self.state.access.forged(f"a fetch reply for rank {call.ranks[0]} from rank {rank}")
            return []
        del self.state.calls.requests[msg.req]
        return [Send(call.driver, Reply(call.req, msg.value, msg.error))]

    def on_delete(self, peer: bytes, msg: Delete, now: float, who: str | None = None) -> list[Send]:
        session = self.state.access.session(peer, who, msg.session)
        if isinstance(session, ErrorInfo):
            return []  # the session is gone and its objects with it, or it is not theirs
        return [
            Send(e.peer, Delete(msg.session, {rank: uris}))
            for rank, uris in msg.uris.items()
            if uris and (e := self.state.registry.by_rank.get(rank)) is not None
        ]
