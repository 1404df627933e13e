"""Which worker serves which rank, how recently each was heard from, and what it caches.

A worker's incarnation (random per process start, sent in its ``WorkerHello``) is a secret
between the worker and the broker: it lets the same process re-register from a new socket
and announce its result channel. The directory every worker receives carries only a digest
of it (:func:`public_incarnation`), so another worker cannot replay it to take the rank or
add a channel speaking for it.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from mpl.wire.control import Directory, PeerInfo, WorkerHello
from mpl.wire.errors import RegistrationError
from mpl.wire.incarnation import public_incarnation
from mpl.wire.limits import PROGRAM_MIRROR_BYTES
from mpl.wire.lru import LRU

__all__ = [
    "PROGRAM_SLOTS",
    "REMEMBERED_DIGESTS",
    "SIZE_BUCKETS",
    "ProgramKey",
    "ProgramMirror",
    "Registry",
    "WorkerEntry",
    "public_incarnation",
]

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
# than the worker drops the entry: it errs only towards sending a program again. That needs
# each key charged no less than the worker's entry: a junk copy's key keeps a genuine
# entry fresh there, so every key of a digest is charged the largest copy sent under it
# (ProgramMirror), not its own copy's size.
ProgramKey = tuple[str, str]
# Digests whose largest copy the mirror remembers exactly after their last key went: the
# worker may still hold such a program (the mirror's keys took more room than its one
# entry), and a junk copy of that digest would make it the worker's newest entry again.
REMEMBERED_DIGESTS = 4 * PROGRAM_SLOTS
# Past those (a flood of junk under digests the worker never held pushes them out, and
# none of the worker's entries), each digest's largest copy is bounded from above by
# SIZE_BUCKETS buckets in each of two rows, each holding the largest copy sent under any
# digest hashed to it, never lowered: the smaller of a digest's two buckets. Another
# digest in both its buckets overstates its size (it is sent again sooner), never less.
SIZE_BUCKETS = 4096


class ProgramMirror:
    """The broker's copy of one worker's program cache: keys (driver, digest) in the order
    the worker's entries are used, bounded in keys and in bytes like ``SizedLRU``, each key
    charged the largest copy this mirror ever sent under its digest: exactly for the newest
    REMEMBERED_DIGESTS digests (at least every digest of a key held), else at most the
    smaller of its two SIZE_BUCKETS buckets says. The worker counts its entry as the
    genuine copy it holds, one of those: never more than a key."""

    def __init__(self, max_keys: int, max_bytes: int) -> None:
        self.max_entries = max_keys
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.dropped = 0  # keys evicted or refused, for status
        self._keys: OrderedDict[ProgramKey, None] = OrderedDict()
        self._largest: LRU[str, int] = LRU(REMEMBERED_DIGESTS)  # digest -> largest copy
        self._held: dict[str, int] = {}  # digest -> its keys held here
        self._buckets = (array("q", bytes(8 * SIZE_BUCKETS)), array("q", bytes(8 * SIZE_BUCKETS)))

    def get(self, key: ProgramKey) -> bool | None:
        """True, the key made the newest, if it is held; else None."""
        if key not in self._keys:
            return None
        self._keys.move_to_end(key)
        self._largest.touch(key[1])
        return True

    def put(self, key: ProgramKey, value: bool, size: int) -> bool:
        """Hold ``key``, whose copy counts ``size``, as the newest; False if a copy of its
        digest is too large to hold."""
        digest = key[1]
        self.pop(key)
        known = self._largest.get(digest)
        if known is None:  # forgotten, or never sent: what the buckets say it may be
            known = min(
                row[hash((digest, n)) % SIZE_BUCKETS] for n, row in enumerate(self._buckets)
            )
        largest = max(size, known)
        for n, row in enumerate(self._buckets):
            at = hash((digest, n)) % SIZE_BUCKETS
            row[at] = max(row[at], size)
        if largest > self.max_bytes:
            self.dropped += 1
            return False
        # the digest's keys held before are charged this copy's size too, if it is larger
        self.nbytes += self._held.get(digest, 0) * (largest - self._largest.get(digest, 0))
        self._largest[digest] = largest
        self._keys[key] = None
        self._held[digest] = self._held.get(digest, 0) + 1
        self.nbytes += largest
        while len(self._keys) > self.max_entries or self.nbytes > self.max_bytes:
            self._drop(next(iter(self._keys)))
            self.dropped += 1
        return True

    def pop(self, key: ProgramKey) -> bool | None:
        if key not in self._keys:
            return None
        self._drop(key)
        return True

    def _drop(self, key: ProgramKey) -> None:
        del self._keys[key]
        digest = key[1]
        self.nbytes -= self._largest.get(digest, 0)
        left = self._held[digest] - 1
        if left:
            self._held[digest] = left
        else:
            del self._held[digest]  # its size stays remembered (see REMEMBERED_DIGESTS)

    def items(self) -> list[tuple[ProgramKey, bool]]:
        """The keys, least recently used first (a copy: for listings)."""
        return [(key, True) for key in self._keys]

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)


@dataclass
class WorkerEntry:
    rank: int
    peer: bytes
    hello: WorkerHello
    joined: float
    last_seen: float
    stats: dict[str, int] = field(default_factory=dict)
    programs: ProgramMirror = field(
        default_factory=lambda: ProgramMirror(PROGRAM_SLOTS, PROGRAM_MIRROR_BYTES)
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
