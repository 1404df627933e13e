"""The worker's control-plane decisions, without I/O: joining, heartbeats, reconnects,
the peer directory and the program cache.

A program is cached under its digest only if the digest is that of the graph's own bytes
(the codec computes it on decode): whoever relays programs cannot slip a different graph in
under a digest that drivers' jobs name.

``tick(now, stats)`` and ``on_broker(msg, now)`` return actions for the ZeroMQ shell:
:class:`ToBroker`, :class:`Reconnect` (make a fresh socket), :class:`Joined` (welcomed,
perhaps by a restarted broker) and :class:`Stop` (refused: the rank is taken).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpl.wire.control import (
    HEARTBEAT_LIVENESS,
    HEARTBEAT_S,
    Bye,
    Directory,
    Heartbeat,
    PeerInfo,
    Refused,
    Reregister,
    Welcome,
    WorkerHello,
)
from mpl.wire.jobs import Program, program_nbytes
from mpl.wire.limits import WORKER_PROGRAM_BYTES
from mpl.wire.lru import LRU, SizedLRU
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo

__all__ = ["PROGRAM_SLOTS", "Joined", "Reconnect", "Stop", "ToBroker", "WorkerCore"]

# At least the broker's mirror (its PROGRAM_SLOTS, and in bytes see mpl.wire.limits): an LRU
# fed the same sequence with more room holds everything the smaller one does.
PROGRAM_SLOTS = 512
_HELLO_FIRST, _HELLO_MAX = 0.05, 2.0  # quick retries while a broker starts up


@dataclass(frozen=True)
class ToBroker:
    msg: Record


@dataclass(frozen=True)
class Reconnect:
    reason: str


@dataclass(frozen=True)
class Joined:
    """Welcomed by the broker; ``new_broker`` when it is not the one we knew (it restarted,
    so every session it ran is gone)."""

    broker_id: str
    new_broker: bool


@dataclass(frozen=True)
class Stop:
    error: ErrorInfo


Action = ToBroker | Reconnect | Joined | Stop


class WorkerCore:
    def __init__(
        self,
        hello: WorkerHello,
        *,
        now: float,
        heartbeat_s: float = HEARTBEAT_S,
        liveness: int = HEARTBEAT_LIVENESS,
    ) -> None:
        self.hello = hello
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.joined = False
        self.broker_id = ""
        self.cluster: dict[str, Any] = {}
        self.world_size = 0
        self.last_heard = now
        self.next_hello = now
        self.hello_wait = _HELLO_FIRST
        self.next_beat = now
        self.directory: dict[int, PeerInfo] = {}
        self.programs: SizedLRU[str, Program] = SizedLRU(PROGRAM_SLOTS, WORKER_PROGRAM_BYTES)
        self.broken: LRU[str, str] = LRU(PROGRAM_SLOTS)  # programs that did not load here, why
        self.refused_programs = 0  # programs whose digest did not match their graph

    def tick(self, now: float, stats: Callable[[], dict[str, int]]) -> list[Action]:
        if not self.joined:
            if now < self.next_hello:
                return []
            self.next_hello = now + self.hello_wait
            self.hello_wait = min(self.hello_wait * 2, _HELLO_MAX)
            return [ToBroker(self.hello)]
        if now - self.last_heard > self.heartbeat_s * self.liveness:
            self._rejoin(now)
            return [Reconnect(f"no word from the broker for {now - self.last_heard:.1f} s")]
        if now >= self.next_beat:
            self.next_beat = now + self.heartbeat_s
            return [ToBroker(Heartbeat(stats(), rank=self.hello.rank))]
        return []

    def on_broker(self, msg: Record, now: float) -> list[Action]:
        self.last_heard = now
        if isinstance(msg, Welcome):
            self.joined = True
            self.heartbeat_s = msg.heartbeat_s
            self.cluster, self.world_size = msg.cluster, msg.world_size
            self.next_beat = now  # report counters at once, then every heartbeat_s
            new = msg.broker_id != self.broker_id
            self.broker_id = msg.broker_id
            return [Joined(msg.broker_id, new)]
        elif isinstance(msg, Refused):
            if not self.joined and msg.error.kind in ("RegistrationError", "AuthenticationError"):
                return [Stop(msg.error)]
        elif isinstance(msg, Reregister):
            self._rejoin(now)
            return self.tick(now, dict)
        elif isinstance(msg, Bye):
            self._rejoin(now)
            self.next_hello = now + _HELLO_FIRST
        elif isinstance(msg, Directory):
            self.directory = msg.peers
        elif isinstance(msg, Program):
            self._cache_program(msg)
        return []

    def _cache_program(self, msg: Program) -> None:
        if msg.graph is None:  # still sealed: nothing to run (the daemon opens it first)
            self.refused_programs += 1
            return
        if msg.graph.digest != msg.digest:
            self.refused_programs += 1
            if msg.digest not in self.programs:  # a genuine copy stays usable
                self.broken[msg.digest] = (
                    f"ProtocolError: the program sent as {msg.digest} has digest "
                    f"{msg.graph.digest}; refused"
                )
            return
        self.programs.put(msg.digest, msg, program_nbytes(msg))
        self.broken.pop(msg.digest, None)

    def program(self, digest: str) -> Program | None:
        return self.programs.get(digest)

    def _rejoin(self, now: float) -> None:
        self.joined = False
        self.next_hello = now
        self.hello_wait = _HELLO_FIRST
        self.last_heard = now
