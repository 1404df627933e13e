"""Which worker serves which rank, how recently each was heard from, and what it caches.

A worker's incarnation (random per process start, sent in its ``WorkerHello``) is a secret
between the worker and the broker: it lets the same process re-register from a new socket
and announce its result channel. The directory every worker receives carries only a digest
of it (:func:`public_incarnation`), so another worker cannot replay it to take the rank or
add a channel speaking for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mpl.wire.control import Directory, PeerInfo, WorkerHello
from mpl.wire.errors import RegistrationError
from mpl.wire.incarnation import public_incarnation
from mpl.wire.limits import PROGRAM_MIRROR_BYTES
from mpl.wire.lru import SizedLRU

__all__ = ["PROGRAM_SLOTS", "ProgramKey", "Registry", "WorkerEntry", "public_incarnation"]

# The broker mirrors each worker's program LRU. Both see the same sequence of programs, and
# the worker keeps at least as many (and as many bytes: mpl.wire.limits), so whatever the
# broker believes is cached really is.
PROGRAM_SLOTS = 256

# A mirror entry: the driver whose copy was sent, and the program's digest. The worker
# caches by digest alone, and a copy may be junk under another's digest (the broker cannot
# see whether a sealed copy opens), so each driver's own copy goes to a worker once: one
# driver's copy never stands in for another's there. Several keys of one digest stand for
# one worker entry; each key's get or put is matched at the worker by a touch or put of
# that entry (or by nothing, when it holds no genuine copy), so the entry is never older
# than its newest key, and the mirror, with more keys in no more room, drops a key no later
# than the worker drops the entry: it errs only towards sending a program again. (Genuine
# copies of a digest are one graph, so its keys are charged alike. A junk copy is charged
# its own size, yet its sender's jobs keep fresh a genuine entry the worker holds for
# another driver: only the worker's larger byte budget, mpl.wire.limits, covers that
# difference, as it did when junk went under a digest the mirror had already dropped.)
ProgramKey = tuple[str, str]


@dataclass
class WorkerEntry:
    rank: int
    peer: bytes
    hello: WorkerHello
    joined: float
    last_seen: float
    stats: dict[str, int] = field(default_factory=dict)
    programs: SizedLRU[ProgramKey, bool] = field(
        default_factory=lambda: SizedLRU(PROGRAM_SLOTS, PROGRAM_MIRROR_BYTES)
    )
    # The key this mirror used last (None: none yet). It is the newest entry of
    # ``programs`` as long as only needs_program uses the mirror, so a job of the same
    # program as the last one needs no look-up and no reorder: the order stays the
    # worker's (nothing else changes the mirror; a repeated hello hands both on).
    last_program: ProgramKey | None = None

    def needs_program(self, key: ProgramKey, nbytes: Callable[[], int] = lambda: 0) -> bool:
        """True if the program of ``key`` (driver, digest) (``nbytes()`` as the worker's
        cache counts it, at most; asked only then) must be sent first; records it as sent
        either way."""
        if key == self.last_program:
            return False
        self.last_program = key
        if self.programs.get(key):
            return False
        # put may refuse it (larger than the whole budget): it is sent again next time
        if not self.programs.put(key, True, nbytes()):
            self.last_program = None
        return True

    def peer_info(self) -> PeerInfo:
        h = self.hello
        return PeerInfo(
            self.rank, public_incarnation(h.incarnation), h.data_addr, h.spu_addr, h.curve_key
        )


@dataclass
class Lost:
    """A rank whose worker is gone, and why."""

    at: float
    reason: str
    hello: WorkerHello


class Registry:
    """Live workers by rank and by peer identity; refuses a second claim on a live rank."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.by_rank: dict[int, WorkerEntry] = {}
        self.by_peer: dict[bytes, WorkerEntry] = {}
        self.channels: dict[bytes, WorkerEntry] = {}  # a worker's extra (result) sockets
        self.lost: dict[int, Lost] = {}

    def worker(self, peer: bytes) -> WorkerEntry | None:
        """The worker speaking through ``peer``: its main socket or one of its channels."""
        return self.by_peer.get(peer) or self.channels.get(peer)

    def add_channel(self, peer: bytes, rank: int, incarnation: str) -> bool:
        """Let ``peer`` speak for ``rank`` too, if it knows the rank's secret incarnation.

        A registered worker's own socket cannot become another rank's channel, and a
        channel stays bound to the worker entry it was added for.
        """
        entry = self.by_rank.get(rank)
        if entry is None or entry.hello.incarnation != incarnation:
            return False
        current = self.worker(peer)
        if current is not None and current is not entry:
            return False
        self.channels[peer] = entry
        return True

    def admit(self, peer: bytes, hello: WorkerHello, now: float) -> WorkerEntry:
        """Register ``peer`` as ``hello.rank``; raises RegistrationError when refused.

        The same process (same incarnation) re-registering from a new socket replaces its
        old entry; a different process claiming a live rank is refused.
        """
        rank = hello.rank
        if not 0 <= rank < self.world_size:
            raise RegistrationError(
                f"rank {rank} is outside this cluster (ranks 0..{self.world_size - 1})"
            )
        current = self.by_rank.get(rank)
        if current is not None and current.peer != peer:
            if current.hello.incarnation != hello.incarnation:
                h = current.hello
                raise RegistrationError(
                    f"rank {rank} is already served by a live worker (pid {h.pid} on {h.host}); "
                    "stop it first, or wait until the broker notices its death (at most 3 s)"
                )
            self.by_peer.pop(current.peer, None)
        entry = WorkerEntry(rank, peer, hello, now, now)
        if current is not None and current.hello.incarnation == hello.incarnation:
            # the same process again (a repeated hello): it keeps its cache and its channels
            entry.programs, entry.last_program = current.programs, current.last_program
            for channel, bound in list(self.channels.items()):
                if bound is current:
                    self.channels[channel] = entry
        self.by_rank[rank] = entry
        self.by_peer[peer] = entry
        self.lost.pop(rank, None)
        return entry

    def remove(self, peer: bytes, reason: str, now: float) -> WorkerEntry | None:
        if self.channels.pop(peer, None) is not None:
            return None  # a result socket closing is not the worker dying
        entry = self.by_peer.pop(peer, None)
        if entry is not None and self.by_rank.get(entry.rank) is entry:
            del self.by_rank[entry.rank]
            self.lost[entry.rank] = Lost(now, reason, entry.hello)
            for channel in [p for p, e in self.channels.items() if e is entry]:
                del self.channels[channel]
        return entry

    def silent(self, now: float, timeout: float) -> list[WorkerEntry]:
        return [e for e in self.by_rank.values() if now - e.last_seen > timeout]

    def directory(self) -> Directory:
        return Directory({r: e.peer_info() for r, e in sorted(self.by_rank.items())})
