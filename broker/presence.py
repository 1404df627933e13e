"""Who is there: workers registering their rank (and result channels), the heartbeats of
workers and drivers, goodbyes, and the loss of a worker. No I/O.

A rank is claimed only with that node's own key in secure mode (:meth:`Presence.impostor`);
a lost worker's calls fail back to their drivers at once, and every worker gets the new
directory. A small class over :class:`~mpl.broker.state.BrokerState`, as its other
families of handlers are.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from mpl.broker.actions import Send
from mpl.broker.calls import lost_rank_error
from mpl.wire.control import Bye, Channel, Heartbeat, Refused, Reregister, Welcome, WorkerHello
from mpl.wire.errors import RegistrationError
from mpl.wire.identity import driver_identity, node_identity, rank_of
from mpl.wire.remote import ErrorInfo

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["MAX_REASON_CHARS", "MAX_WORKER_STATS", "Presence", "worker_counters"]

# Counters kept from a worker's heartbeat (it sends a few dozen): each status the broker
# builds copies them into the worker's row, for drivers and the metrics page.
MAX_WORKER_STATS = 128
# What the broker keeps of a worker's own words about itself (a goodbye's reason, its host
# name): each is repeated in recent errors, status rows and every later job's error naming
# its rank, and a header holds 16 MiB of it (second red team w31, B6)
MAX_REASON_CHARS = 256
_COUNTER_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
# a rank row's own fields (mpl.broker.status_view): the broker's word, not the worker's
_ROW_FIELDS = frozenset(
    ("rank", "state", "pid", "host", "heartbeat_age_s", "incarnation", "reason")
)


def worker_counters(stats: dict[str, Any]) -> dict[str, Any]:
    """What the broker keeps of a heartbeat's counters: at most ``MAX_WORKER_STATS``, named
    by short identifiers, none a field of the rank's row. A worker's heartbeat could hold
    millions (kept, and copied into every status), and spread into its row after the
    broker's fields it rewrote them: its rank, its heartbeat's age (red team w31, R5)."""
    kept: dict[str, Any] = {}
    for name, value in stats.items():
        if name not in _ROW_FIELDS and _COUNTER_NAME.match(name):
            kept[name] = value
            if len(kept) >= MAX_WORKER_STATS:
                break
    return kept


class Presence:
    """The worker and heartbeat handlers of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state

    # -- control --------------------------------------------------------------------------
    def impostor(self, peer: bytes, rank: int, who: str | None, tag: str) -> Send | None:
        """Refuse a claim on ``rank`` unless node ``rank``'s own key made it.

        The incarnation every worker sees in the Directory is no credential, and the order
        of arrival after a broker restart gives no rank to whoever speaks first.
        """
        state = self.state
        if rank_of(who, state.cluster) == rank:
            return None
        state.counters["protocol_errors"] += 1
        name = state.cluster.nodes[rank].name if 0 <= rank < state.cluster.world_size else "?"
        message = (
            f"{who or 'an unauthenticated peer'} may not speak for rank {rank} "
            f"(only {node_identity(name)} may); check that the worker was started with "
            f"rank {rank}'s key"
        )
        state._note(f"refused {tag!r}: {message}")
        return Send(peer, Refused(ErrorInfo("AuthenticationError", message, rank=rank)))

    def file_owners(self, msg: WorkerHello) -> dict[str, str]:
        """The owners a hello reports for its own files (name -> driver identity) that the
        broker keeps: in secure mode those naming a driver of its spec (which also bounds
        each one), in plaintext none (its drivers are not authenticated; nothing is listed
        by owner). The worker's word: a hostile party's worker can misreport only the
        owners of the names on its own disk."""
        if not self.state.secure or not msg.owners:
            return {}
        drivers = {driver_identity(d.name) for d in self.state.cluster.drivers}
        return {
            info.name: owner
            for info in msg.symbols
            if type(owner := msg.owners.get(info.name)) is str and owner in drivers
        }

    def on_hello(
        self, peer: bytes, msg: WorkerHello, now: float, who: str | None = None
    ) -> list[Send]:
        state = self.state
        state.drivers.pop(peer, None)
        try:
            entry = state.registry.admit(peer, msg, now)
        except RegistrationError as exc:
            state._note(f"refused rank {msg.rank} (pid {msg.pid} on {msg.host}): {exc}")
            return [Send(peer, Refused(ErrorInfo("RegistrationError", str(exc), rank=msg.rank)))]
        # what its disk holds now, and (secure mode) whose each file is
        state.persisted.replace_rank(entry.rank, msg.symbols, self.file_owners(msg))
        welcome = Welcome(
            entry.rank,
            state.cluster.world_size,
            state.broker_id,
            state.heartbeat_s,
            state.cluster.to_dict(),
            state.max_message,
        )
        joined = state.runtimes.joined(entry.rank, peer)  # open sessions' runtime_info
        return [Send(peer, welcome), *joined, *self.broadcast_directory()]

    def on_channel(
        self, peer: bytes, msg: Channel, now: float, who: str | None = None
    ) -> list[Send]:
        state = self.state
        if not state.access.channel_key_ok(who, msg.rank):
            state._note(f"ignored a channel for rank {msg.rank} from {who}")
        elif not state.registry.add_channel(peer, msg.rank, msg.incarnation):
            state._note(f"ignored a channel for rank {msg.rank}: no such live worker")
        return []

    def on_heartbeat(
        self, peer: bytes, msg: Heartbeat, now: float, who: str | None = None
    ) -> list[Send]:
        state = self.state
        worker = state.registry.by_peer.get(peer)
        if worker is not None:
            worker.stats = worker_counters(msg.stats)
            return []
        if msg.rank >= 0:  # a worker we do not know: we restarted, or it was dropped
            return [Send(peer, Reregister(state.broker_id))]
        state.drivers[peer] = now
        state.beating.add(peer)
        identity = state.access.driver(peer, who)
        gone = False
        for sid in msg.sessions:
            session = state.sessions.get(sid)
            if session is None:
                gone = True
            elif identity is not None and session.allows(identity):
                session.last_seen = now  # only its own drivers keep a session's lease
        return [Send(peer, Reregister(state.broker_id))] if gone else []

    def on_bye(self, peer: bytes, msg: Bye, now: float, who: str | None = None) -> list[Send]:
        state = self.state
        if peer in state.registry.by_peer:
            reason = msg.reason[:MAX_REASON_CHARS] or "shutdown"
            return self.lose_worker(peer, f"it said goodbye ({reason})", now)
        return state.disconnected(peer, now)

    def lose_worker(self, peer: bytes, reason: str, now: float) -> list[Send]:
        state = self.state
        entry = state.registry.remove(peer, reason, now)
        if entry is None:
            return []
        state._note(f"rank {entry.rank} lost: {reason}")
        out: list[Send] = []
        for call in state.calls.involving(entry.rank):
            info = lost_rank_error(entry.rank, reason, getattr(call, "job", ""))
            out += state._fail_call(call, info)
        return out + self.broadcast_directory()

    def broadcast_directory(self) -> list[Send]:
        state = self.state
        directory = state.registry.directory()
        return [Send(p, directory) for p in state.registry.by_peer]
