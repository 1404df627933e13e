"""Where traffic for work this worker has not been told about waits, briefly and bounded.

A peer's move (or SPU message) can overtake the broker's ``Exec`` that tells this worker
about the job, so traffic for an unknown job cannot simply be refused. But any party that
can reach the data socket could also send traffic for jobs that will never exist, so it is
held apart from the genuine traffic, at most ``max_entries`` items and ``max_bytes`` bytes,
for at most ``hold_s`` seconds. What does not fit is dropped and counted (``dropped``);
genuine traffic, for work the worker knows, never waits here and is never refused for lack
of room. When the worker learns of the work, :meth:`release` hands its held items over.

**Each sender gets a fair share.** One party filling the whole area with moves for jobs
that will never exist would make another party's genuine early move be dropped, and its
job fail. So every item is charged to its sender (``sender_of`` the held key: the rank its
connection proved in secure mode; in plaintext the claimed source, which is all there is
there), and with ``senders()`` ranks that may send, one sender holds at most
``max_entries // senders()`` items and ``max_bytes // senders()`` bytes (at least one item),
and at most ``senders()`` distinct senders hold anything at once (more can only be forged
sources). What is over its share is dropped and counted per sender (``over_share``). While
the number of senders is not known yet (0: a plaintext worker before the broker's
``Welcome``), only the totals apply.

Not thread-safe: the mailbox that owns it calls it under its own lock.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from mpl.wire.lru import LRU

if TYPE_CHECKING:
    from mpl.wire.curve import Curve

__all__ = [
    "HOLD_BYTES",
    "HOLD_ENTRIES",
    "HOLD_S",
    "Holding",
    "approx_nbytes",
    "held_moves",
    "held_spu",
]

HOLD_ENTRIES = 1024
HOLD_BYTES = 256 * 1024 * 1024
HOLD_S = 10.0
_OTHER = 64  # what a value of no known size is counted as
_COUNTED_SENDERS = 256  # senders whose over-share drops are remembered (claimed ones too)


def approx_nbytes(value: Any, depth: int = 0) -> int:
    """A cheap estimate of the memory ``value`` holds (arrays and buffers exactly)."""
    nbytes = getattr(value, "nbytes", None)  # numpy arrays, memoryviews, zmq frames
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if depth < 4 and isinstance(value, (list, tuple)):
        return _OTHER + sum(approx_nbytes(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return _OTHER + sum(
            approx_nbytes(k, depth + 1) + approx_nbytes(v, depth + 1) for k, v in value.items()
        )
    return max(_OTHER, sys.getsizeof(value, _OTHER)) if depth < 4 else _OTHER


class _Group:
    __slots__ = ("arrived", "items", "nbytes")

    def __init__(self, arrived: float) -> None:
        self.arrived = arrived
        self.items: dict[Hashable, tuple[Any, int, Hashable]] = {}  # value, size, sender
        self.nbytes = 0


def _no_sender(_key: Hashable) -> Hashable:
    return None


def _unknown() -> int:
    return 0


class Holding:
    """Items by group (a job, an SPU lane) and key, within bounds and per-sender shares,
    oldest group first out."""

    def __init__(
        self,
        *,
        max_entries: int = HOLD_ENTRIES,
        max_bytes: int = HOLD_BYTES,
        hold_s: float = HOLD_S,
        clock: Callable[[], float] = time.monotonic,
        sender_of: Callable[[Hashable], Hashable] = _no_sender,
        senders: Callable[[], int] = _unknown,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hold_s = hold_s
        self._clock = clock
        self._sender_of = sender_of
        self._senders = senders
        self._groups: dict[Hashable, _Group] = {}  # in order of first arrival
        self._by_sender: dict[Hashable, list[int]] = {}  # sender: [entries, bytes] held
        self.entries = 0
        self.nbytes = 0
        self.dropped = 0
        self.over_share: LRU[Hashable, int] = LRU(_COUNTED_SENDERS)  # sender: items dropped

    def share(self) -> tuple[int, int]:
        """What one sender may hold at most: (entries, bytes)."""
        senders = self._senders()
        if senders <= 0:
            return self.max_entries, self.max_bytes
        return max(1, self.max_entries // senders), self.max_bytes // senders

    def hold(self, group: Hashable, key: Hashable, value: Any) -> bool:
        """Keep ``value``; False (and counted as dropped) when it does not fit, is over its
        sender's share, or ``key`` is already held."""
        self._expire()
        held = self._groups.get(group)
        if held is not None and key in held.items:
            return False
        size = approx_nbytes(value)
        if self.entries + 1 > self.max_entries or self.nbytes + size > self.max_bytes:
            self.dropped += 1
            return False
        sender = self._sender_of(key)
        if not self._within_share(sender, size):
            self.dropped += 1
            self.over_share[sender] = self.over_share.get(sender, 0) + 1
            return False
        if held is None:
            held = self._groups[group] = _Group(self._clock())
        held.items[key] = (value, size, sender)
        held.nbytes += size
        self.entries += 1
        self.nbytes += size
        charged = self._by_sender.setdefault(sender, [0, 0])
        charged[0] += 1
        charged[1] += size
        return True

    def _within_share(self, sender: Hashable, size: int) -> bool:
        senders = self._senders()
        if senders <= 0:
            return True
        charged = self._by_sender.get(sender)
        if charged is None:  # more distinct senders than ranks: some are forged
            return len(self._by_sender) < senders
        entries, nbytes = self.share()
        return charged[0] + 1 <= entries and charged[1] + size <= nbytes

    def holds(self, group: Hashable, key: Hashable) -> bool:
        held = self._groups.get(group)
        return held is not None and key in held.items

    def held_by(self, sender: Hashable) -> tuple[int, int]:
        """What ``sender`` holds here now: (entries, bytes)."""
        charged = self._by_sender.get(sender, (0, 0))
        return charged[0], charged[1]

    def release(self, group: Hashable) -> list[tuple[Hashable, Any]]:
        """Hand over (and forget) what is held for ``group``, in arrival order."""
        held = self._groups.pop(group, None)
        if held is None:
            return []
        self.entries -= len(held.items)
        self.nbytes -= held.nbytes
        for _value, size, sender in held.items.values():
            charged = self._by_sender[sender]
            charged[0] -= 1
            charged[1] -= size
            if not charged[0]:
                del self._by_sender[sender]
        return [(key, value) for key, (value, _size, _sender) in held.items.items()]

    def forget(self, which: Callable[[Hashable], bool]) -> None:
        """Drop every group ``which`` selects (a session closed, a lane dropped)."""
        for group in [g for g in self._groups if which(g)]:
            self.release(group)

    def _expire(self) -> None:
        limit = self._clock() - self.hold_s
        while self._groups:
            group, held = next(iter(self._groups.items()))
            if held.arrived > limit:
                return
            self.dropped += len(held.items)
            self.release(group)


def _ranks(curve: Curve | None, world: Callable[[], int]) -> Callable[[], int]:
    """How many ranks may send: in secure mode from this party's own spec (never the
    broker's word), in plaintext the world size the broker announced (0 until then)."""
    cluster = curve.cluster if curve is not None else None
    if cluster is not None:
        size = cluster.world_size
        return lambda: size
    return world


def _move_src(held: Any) -> Hashable:
    src: Hashable = held[0][4]  # held as ((session, job, op, seq, src),)
    return src


def _spu_src(held: Any) -> Hashable:
    src: Hashable = held[0][1]  # held as ((lane, src, key), arrival)
    return src


def held_moves(curve: Curve | None, world: Callable[[], int]) -> Holding:
    """The holding area for peer moves, shared fairly between the ranks that may send."""
    return Holding(sender_of=_move_src, senders=_ranks(curve, world))


def held_spu(curve: Curve | None, world: Callable[[], int]) -> Holding:
    """The holding area for SPU link messages, shared fairly between the ranks."""
    return Holding(sender_of=_spu_src, senders=_ranks(curve, world))
