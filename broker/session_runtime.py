"""A session's own runtime_info reaching its nodes' workers, before the driver's open ends.

When a session opens with its own spec, every node the spec names is sent that node's
``runtime_info`` and the session's SPU devices (``SessionRuntime``); the driver gets its
``SessionOpened`` only once every one of those workers has accepted it. A worker that
refuses (a version or platform it cannot serve, :mod:`mpl.wire.runtime_info`) ends the
open: the driver gets that worker's ``ClusterSpecError`` and the session is closed on
every worker. A named node whose worker
is not connected is told when it joins (it answers nothing then; its kernels see the
session's runtime_info, or the cluster's if it refused).

Only the worker serving a rank may answer for it (the ``Ack`` handler checks that first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mpl.broker.actions import Send
from mpl.broker.admission import refuse_call
from mpl.broker.calls import RequestCall
from mpl.broker.sessions import SessionEntry
from mpl.wire.runtime_info import node_runtime_info
from mpl.wire.session_cluster import spu_devices
from mpl.wire.sessions import Ack, Reply, SessionOpened, SessionRuntime

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["OPEN_KIND", "SessionRuntimes"]

OPEN_KIND = "open"  # the RequestCall kind of a session waiting for its workers' answers


def _named(requested: Mapping[str, Any]) -> frozenset[str]:
    """The nodes a driver's spec names (it passed ``session_cluster``: they are known)."""
    return frozenset(
        str(n.get("name")) for n in requested.get("nodes") or () if isinstance(n, Mapping)
    )


class SessionRuntimes:
    """The session-runtime handlers of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state
        self._opening: dict[int, SessionOpened] = {}  # broker request -> the answer held back

    def announce(
        self, peer: bytes, entry: SessionEntry, requested: Mapping[str, Any], opened: SessionOpened
    ) -> list[Send]:
        """Send each connected named node its runtime_info; ``opened`` waits for them all."""
        state = self.state
        cluster = entry.cluster or {}
        entry.named_nodes = _named(requested)
        ranks = tuple(
            r
            for r, node in enumerate(cluster.get("nodes") or ())
            if node.get("name") in entry.named_nodes and r in state.registry.by_rank
        )
        if not ranks:
            return [Send(peer, opened)]
        if (busy := refuse_call(state.calls)) is not None:
            state.sessions.remove(entry.sid)
            return [Send(peer, state._req_error(opened.req, "ProtocolError", busy))]
        # answers held back for calls that ended otherwise (a worker lost) are dropped here
        for bid in [b for b in self._opening if b not in state.calls.requests]:
            del self._opening[bid]
        devices = spu_devices(cluster)
        bid = state.calls.new_req()
        state.calls.requests[bid] = RequestCall(
            peer, entry.sid, ranks, set(ranks), req=opened.req, bid=bid, kind=OPEN_KIND
        )
        self._opening[bid] = opened
        return [
            Send(
                state.registry.by_rank[r].peer,
                SessionRuntime(entry.sid, bid, node_runtime_info(cluster, r), devices),
            )
            for r in ranks
        ]

    def acked(self, call: RequestCall, msg: Ack) -> list[Send]:
        """A named node's answer (already checked to come from the worker serving it)."""
        state = self.state
        if msg.error is not None:
            state.calls.requests.pop(call.bid, None)
            self._opening.pop(call.bid, None)
            out = [Send(call.driver, Reply(call.req, error=msg.error))]
            return out + state.session_calls.close_session(
                call.session, f"refused by rank {msg.rank}"
            )
        call.pending.discard(msg.rank)
        if call.pending:
            return []
        state.calls.requests.pop(call.bid, None)
        opened = self._opening.pop(call.bid, None)
        return [] if opened is None else [Send(call.driver, opened)]

    def joined(self, rank: int, peer: bytes) -> list[Send]:
        """What a worker (re)joining at ``rank`` is told: the runtime_info of every open
        session whose own spec names its node (no answer asked)."""
        out: list[Send] = []
        for entry in self.state.sessions.by_id.values():
            cluster = entry.cluster
            if cluster is None or not entry.named_nodes or rank >= len(cluster["nodes"]):
                continue
            if cluster["nodes"][rank].get("name") in entry.named_nodes:
                info = node_runtime_info(cluster, rank)
                out.append(Send(peer, SessionRuntime(entry.sid, 0, info, spu_devices(cluster))))
        return out
