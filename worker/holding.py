"""Where traffic for work this worker has not been told about waits, briefly and bounded.

A peer's move (or SPU message) can overtake the broker's ``Exec`` that tells this worker
about the job, so traffic for an unknown job cannot simply be refused. But any party that
can reach the data socket could also send traffic for jobs that will never exist, so it is
held apart from the genuine traffic, at most ``max_entries`` items and ``max_bytes`` bytes,
for at most ``hold_s`` seconds. What does not fit is dropped and counted (``dropped``);
genuine traffic, for work the worker knows, never waits here and is never refused for lack
of room. When the worker learns of the work, :meth:`release` hands its held items over.

**Each sender is guaranteed a fair share.** One party filling the whole area with moves for
jobs that will never exist would make another party's genuine early move be dropped, and
its job fail. So every item is charged to its sender (``sender_of`` the held key: the rank
its connection proved in secure mode; in plaintext the claimed source, which is all there
is there). With ``senders()`` ranks that may send, each sender's share is
``max_entries // senders()`` items and ``max_bytes // senders()`` bytes (at least one item),
and the shares together never exceed the area, so a sender always finds room within its
share. A sender may hold more than its share only while the area has room nobody else
claims (one big genuine move, or many jobs in flight to a busy worker, still wait here as
before): when a sender within its share needs that room, the newest items of senders over
theirs are dropped to make it. So a flood takes at most the free room, and gives it back.
A sender is a rank: one outside ``range(senders())`` can only be a forged source (in
plaintext) and holds nothing. Items dropped because their sender was over its share are
counted per sender (``over_share``) and in ``dropped``. While the number of senders is not
known yet (0: a plaintext worker before the broker's ``Welcome``), only the totals apply.

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


class _Charge:
    """What one sender holds: counts, and its items newest last (the first to go)."""

    __slots__ = ("entries", "nbytes", "order")

    def __init__(self) -> None:
        self.entries = 0
        self.nbytes = 0
        self.order: dict[tuple[Hashable, Hashable], None] = {}  # (group, key), in arrival order


def _no_sender(_key: Hashable) -> Hashable:
    return None


def _unknown() -> int:
    return 0


class Holding:
    """Items by group (a job, an SPU lane) and key, within bounds, each sender guaranteed
    its share, oldest group first out."""

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
        self.senders = senders  # the mailbox that owns it shares its open groups by it too
        self._groups: dict[Hashable, _Group] = {}  # in order of first arrival
        self._charges: dict[Hashable, _Charge] = {}  # by sender, while it holds anything
        self.entries = 0
        self.nbytes = 0
        self.dropped = 0
        self.over_share: LRU[Hashable, int] = LRU(_COUNTED_SENDERS)  # sender: items dropped

    def share(self) -> tuple[int, int]:
        """What one sender is guaranteed: (entries, bytes); the whole area while the number
        of senders is not known."""
        senders = self._senders()
        if senders <= 0:
            return self.max_entries, self.max_bytes
        return max(1, self.max_entries // senders), self.max_bytes // senders

    def hold(self, group: Hashable, key: Hashable, value: Any) -> bool:
        """Keep ``value``; False (and counted as dropped) when ``key`` is already held, or it
        does not fit: the area is full and its sender is over its share, or its sender is
        no rank of this world."""
        self._expire()
        held = self._groups.get(group)
        if held is not None and key in held.items:
            return False
        size = approx_nbytes(value)
        sender = self._sender_of(key)
        senders = self._senders()
        if senders > 0 and not (type(sender) is int and 0 <= sender < senders):
            return self._refuse(None)  # no rank of this world: a forged source
        if not self._fits(size):
            entries, nbytes = self.share()
            charge = self._charges.get(sender)
            held_entries, held_bytes = (charge.entries, charge.nbytes) if charge else (0, 0)
            within = held_entries + 1 <= entries and held_bytes + size <= nbytes
            if not (senders > 0 and within and self._reclaim(size, entries, nbytes)):
                return self._refuse(sender if senders > 0 else None)
            held = self._groups.get(group)  # reclaiming may have emptied it
        if held is None:
            held = self._groups[group] = _Group(self._clock())
        held.items[key] = (value, size, sender)
        held.nbytes += size
        self.entries += 1
        self.nbytes += size
        charge = self._charges.get(sender)
        if charge is None:
            charge = self._charges[sender] = _Charge()
        charge.entries += 1
        charge.nbytes += size
        charge.order[(group, key)] = None
        return True

    def _fits(self, size: int) -> bool:
        return self.entries + 1 <= self.max_entries and self.nbytes + size <= self.max_bytes

    def _refuse(self, sender: Hashable) -> bool:
        self.dropped += 1
        if sender is not None:
            self.over_share[sender] = self.over_share.get(sender, 0) + 1
        return False

    def _reclaim(self, size: int, entries: int, nbytes: int) -> bool:
        """Drop the newest items of senders over their share until ``size`` more bytes and
        one more item fit; False if it still does not (only senders within theirs left)."""
        while not self._fits(size):
            over = [s for s, c in self._charges.items() if c.entries > entries or c.nbytes > nbytes]
            if not over:
                return False
            # the most over its share gives first: a flood, before a big genuine move
            sender = max(over, key=lambda s: self._charges[s].entries)
            group, key = next(reversed(self._charges[sender].order))
            self._drop(group, key)
            self._refuse(sender)
        return True

    def _drop(self, group: Hashable, key: Hashable) -> None:
        held = self._groups[group]
        _value, size, sender = held.items.pop(key)
        held.nbytes -= size
        if not held.items:
            del self._groups[group]
        self.entries -= 1
        self.nbytes -= size
        self._uncharge(sender, group, key, size)

    def _uncharge(self, sender: Hashable, group: Hashable, key: Hashable, size: int) -> None:
        charge = self._charges[sender]
        charge.entries -= 1
        charge.nbytes -= size
        del charge.order[(group, key)]
        if not charge.entries:
            del self._charges[sender]

    def holds(self, group: Hashable, key: Hashable) -> bool:
        held = self._groups.get(group)
        return held is not None and key in held.items

    def held_by(self, sender: Hashable) -> tuple[int, int]:
        """What ``sender`` holds here now: (entries, bytes)."""
        charge = self._charges.get(sender)
        return (charge.entries, charge.nbytes) if charge is not None else (0, 0)

    def release(self, group: Hashable) -> list[tuple[Hashable, Any]]:
        """Hand over (and forget) what is held for ``group``, in arrival order."""
        held = self._groups.pop(group, None)
        if held is None:
            return []
        self.entries -= len(held.items)
        self.nbytes -= held.nbytes
        for key, (_value, size, sender) in held.items.items():
            self._uncharge(sender, group, key, size)
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
    src: Hashable = held[0][4]  # held as ((session, job, op, seq, src, sealer),)
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
