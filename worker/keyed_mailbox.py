"""Where traffic from peers waits for the thread that needs it: one generic keyed mailbox.

A worker has two such places: peer moves, keyed ``(session, job, op, seq, src, sealer)``
and grouped by job (a move of one driver's job is never taken by another driver's job of
that id: it waits unclaimed and goes with the job's group), and libspu's messages, keyed
``(lane, src, key)`` and grouped by SPU lane. Both need the same things, so both are a
:class:`KeyedMailbox`:

* **Groups open before their traffic is accepted.** A group is opened when the worker
  learns of its work (the broker's ``Exec``, a lane made by the local runtime, or a thread
  waiting on one of its keys). Traffic for a group not open yet may have overtaken its
  announcement, or may be forged for work that will never exist: it waits in a bounded
  :class:`~mpl.worker.holding.Holding` area and is handed over when the group opens, or
  dropped (counted) when that is full or it is a few seconds old.
* **Only what the work takes.** A group opened with the keys its work takes (a job's
  moves: ``worker/move_keys.py``, by ``slot_of`` each key) refuses any other, counted in
  ``unexpected``: a co-party's move for an op the program never reads would otherwise be
  kept until the job ends (red team w32, R32-3); a thread waiting in such a group that
  is no longer open (pushed out by 4,096 newer ones) reopens it with the same keys. With
  ``once``, such a group keeps one
  value per slot, whatever the rest of its key: a move's ``sealer`` is its sender's word,
  so the one move a program takes from a party, sent again under made-up sealers, would
  otherwise be kept once per name. A group opened without (a lane: libspu's keys are not
  known ahead) keeps any key.
* **Bounds.** Values waiting in open groups are bounded in entries and, optionally, bytes;
  beyond either a new one is dropped and counted in ``overflow`` (the run that needed it
  then fails at its deadline). **Each sender has its share** (``sender_of`` a key: the rank
  its connection proved in secure mode) once the number of ranks is known (``senders``):
  ``max_entries // senders`` entries and ``max_bytes // senders`` bytes in open groups, so
  one party filling its lane or job cannot crowd out the others' traffic, nor hold more
  than its share of memory. One value bigger than the byte share still fits while its
  sender has nothing else waiting (a genuine big message: promise 6), in room no other
  rank's share needs: the bytes every other sender (this rank, ``own``, never sends) has
  not used of its share stay free for it, so a party's one big value never makes another
  party's value within its share overflow. What a sender sends
  past its share is dropped and counted in ``overflow`` and, per sender, ``over_share``.
* **Exactly once, or in order.** With ``once`` a key is delivered at most once per group
  (moves: a repeated copy is a ``duplicate``); without it every value is kept, first in
  first out per key (libspu sends one key several times).
* **Ends.** :meth:`close` (an abort, a dropped lane, a closed session) wakes every thread
  waiting on the group with ``JobAbortedError`` carrying the reason; :meth:`end` (the work
  finished) just forgets it. Either way the group's values are freed and its late traffic
  is dropped and counted in ``late``.
* **Deadlines.** :meth:`take` waits at most until its deadline (``MplTimeoutError``), and
  also stops when its ``stop`` callback gives a reason after a :meth:`wake`.

The mailbox decides nothing about jobs or sessions: the worker's state machine
(``worker/state.py``) says which groups to open, close or end; this class only keeps the
values, the bounds and the memory of closed groups that late traffic is checked against.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Container, Hashable
from typing import Any, Generic, TypeVar

from mpl.wire.errors import JobAbortedError, MplTimeoutError
from mpl.wire.lru import LRU
from mpl.worker.holding import Holding, approx_nbytes
from mpl.worker.move_keys import MoveSlot

__all__ = ["KeyedMailbox", "MoveKey", "SpuKey", "move_mailbox", "spu_mailbox"]

K = TypeVar("K", bound=Hashable)
G = TypeVar("G", bound=Hashable)
MoveKey = tuple[str, str, int, int, int, str]  # session, job, op, seq, src, sealer
SpuKey = tuple[str, int, str]  # lane, src, libspu key
_MEMORY = 4096  # closed or ended groups remembered, to drop their late traffic
_COUNTED_SENDERS = 256  # senders whose over-share drops are remembered


class _Anything:
    """What an open group takes when its work's keys are not known: any key."""

    def __contains__(self, _slot: object) -> bool:
        return True


_ANY = _Anything()  # looked for by identity: no call per value


def _no_sender(_key: Any) -> Hashable:
    return None


def _whole(key: Any) -> Hashable:
    whole: Hashable = key
    return whole


class KeyedMailbox(Generic[K, G]):
    """Values by key, grouped by ``group_of(key)``, bounded, with per-group close."""

    def __init__(
        self,
        group_of: Callable[[K], G],
        *,
        once: bool,
        max_entries: int,
        max_bytes: int | None = None,
        holding: Holding | None = None,
        size: Callable[[Any], int] = approx_nbytes,
        memory: int = _MEMORY,
        slot_of: Callable[[K], Hashable] = _whole,
        sender_of: Callable[[K], Hashable] = _no_sender,
        own: Hashable = None,
    ) -> None:
        self._group_of = group_of
        self._own = own  # this process's rank: a sender whose share no one needs kept
        self._slot_of = slot_of
        self._sender_of = sender_of
        self._once = once
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size = size if max_bytes is not None else (lambda _value: 0)
        self._cond = threading.Condition()
        self._items: dict[K, collections.deque[tuple[Any, int, Hashable]]] = {}
        self._keys: dict[G, set[K]] = {}  # per group: keys with values (and, once, seen)
        # per group opened with its slots (and once): the slots a value was kept for
        self._filled: dict[G, set[Hashable]] = {}
        # open groups: the slots each takes (_ANY: any key)
        self._open: LRU[G, Container[Hashable]] = LRU(memory)
        self._closed: LRU[G, str] = LRU(memory)  # why; "" when it ended normally
        self._held = holding or Holding()
        self._senders = self._held.senders  # the ranks that may send: as the holding area's
        self._charges: dict[Hashable, list[int]] = {}  # sender: [entries, bytes] waiting
        self._arrivals = 0  # tells apart held values that share a key
        self.entries = 0  # values waiting in open groups, and their bytes
        self.nbytes = 0
        self.duplicates = 0  # a key delivered twice (``once`` only)
        self.late = 0  # for groups already closed or ended
        self.overflow = 0  # refused: the bounds were reached
        self.unexpected = 0  # refused: a key its group's work does not take
        self.over_share: LRU[Hashable, int] = LRU(_COUNTED_SENDERS)  # sender: refused
        self.over_shares = 0  # refused past their sender's share, over all senders

    # -- counters -------------------------------------------------------------------------
    @property
    def held_dropped(self) -> int:
        """Traffic for groups never opened that did not fit in the holding area or expired."""
        return self._held.dropped

    @property
    def dropped(self) -> int:
        """Everything refused for lack of room or purpose: held, overflow, unexpected and
        late."""
        return self._held.dropped + self.overflow + self.unexpected + self.late

    def held(self) -> int:
        with self._cond:
            return self._held.entries

    def pending(self) -> tuple[int, int]:
        """Values waiting for their taker, and their bytes (0 when bytes are not bounded)."""
        with self._cond:
            return self.entries, self.nbytes

    # -- groups ---------------------------------------------------------------------------
    def open(self, group: G, takes: Container[Hashable] | None = None) -> None:
        """The worker runs this group's work: accept its traffic, including what is held;
        only keys whose ``slot_of`` is in ``takes``, when given."""
        with self._cond:
            self._open_group(group, _ANY if takes is None else takes)

    def _open_group(self, group: G, takes: Container[Hashable] = _ANY) -> None:
        if group in self._open or group in self._closed:
            return
        self._open[group] = takes
        for held, value in self._held.release(group):
            self._store(group, held[0], value)  # type: ignore[index]  # held as (key, ...)
        self._cond.notify_all()

    def close(self, group: G, reason: str) -> None:
        """Free the group's values, wake its waiters with ``reason``, drop its late traffic."""
        with self._cond:
            self._finish(group, reason)
            self._cond.notify_all()

    def end(self, group: G) -> None:
        """The group's work finished: free its leftovers and drop its late traffic."""
        with self._cond:
            if self._closed.get(group):  # keep an abort's reason for a late waiter
                return
            self._finish(group, "")

    def close_where(self, which: Callable[[G], bool], reason: str) -> None:
        """:meth:`close` every group ``which`` selects, known or only held."""
        with self._cond:
            for group in [g for g in set(self._keys) | set(self._open) if which(g)]:
                self._finish(group, reason)
            self._held.forget(which)  # type: ignore[arg-type]
            self._cond.notify_all()

    def reason(self, group: G) -> str | None:
        """Why the group was closed (None: open or unknown; "" when it ended normally)."""
        with self._cond:
            return self._closed.get(group)

    def wake(self) -> None:
        """Make every waiter check its ``stop`` callback again (something it asks changed)."""
        with self._cond:
            self._cond.notify_all()

    def _finish(self, group: G, reason: str) -> None:
        self._closed[group] = reason
        self._open.pop(group, None)
        self._held.release(group)
        self._filled.pop(group, None)
        for key in self._keys.pop(group, ()):
            queue = self._items.pop(key, None)
            if queue:
                self.entries -= len(queue)
                for _value, size, sender in queue:
                    self.nbytes -= size
                    self._uncharge(sender, size)

    def _uncharge(self, sender: Hashable, size: int) -> None:
        charge = self._charges[sender]
        charge[0] -= 1
        charge[1] -= size
        if not charge[0]:
            del self._charges[sender]

    def waiting_from(self, sender: Hashable) -> tuple[int, int]:
        """What ``sender`` has waiting in open groups: (entries, bytes)."""
        with self._cond:
            charge = self._charges.get(sender)
            return (charge[0], charge[1]) if charge is not None else (0, 0)

    # -- values ---------------------------------------------------------------------------
    def put(self, key: K, value: Any) -> bool:
        """Keep an arriving value; False when it was dropped (and counted)."""
        group = self._group_of(key)
        with self._cond:
            if group in self._closed:
                self.late += 1
                return False
            if group not in self._open:
                if self._once:
                    if self._held.holds(group, (key,)):
                        self.duplicates += 1
                        return False
                    return self._held.hold(group, (key,), value)
                self._arrivals += 1
                return self._held.hold(group, (key, self._arrivals), value)
            if self._store(group, key, value):
                self._cond.notify_all()
                return True
            return False

    def _store(self, group: G, key: K, value: Any) -> bool:
        takes = self._open.get(group)
        filled: set[Hashable] | None = None
        if takes is not _ANY:
            slot = self._slot_of(key)
            if slot not in takes:  # type: ignore[operator]
                self.unexpected += 1
                return False
        keys = self._keys.setdefault(group, set())
        if self._once and key in keys:
            self.duplicates += 1  # the same key again (a resent move): no one's error
            return False
        if self._once and takes is not _ANY:
            # one value per slot: the same slot under another key (another sealer's name)
            filled = self._filled.setdefault(group, set())
            if slot in filled:
                self.unexpected += 1
                return False
        size = self._size(value)
        if self.entries >= self.max_entries or (
            self.max_bytes is not None and self.nbytes + size > self.max_bytes
        ):
            self.overflow += 1
            return False
        sender = self._sender_of(key)
        charge = self._charges.get(sender)
        if not self._within_share(sender, charge, size):
            self.overflow += 1
            self.over_shares += 1
            self.over_share[sender] = (self.over_share.get(sender) or 0) + 1
            return False
        if charge is None:
            charge = self._charges[sender] = [0, 0]
        charge[0] += 1
        charge[1] += size
        keys.add(key)
        if filled is not None:
            filled.add(slot)
        self._items.setdefault(key, collections.deque()).append((value, size, sender))
        self.entries += 1
        self.nbytes += size
        return True

    def _within_share(self, sender: Hashable, charge: list[int] | None, size: int) -> bool:
        """Whether one more value of ``size`` from ``sender`` stays within its share (see
        the module docstring); always, while the number of ranks is not known."""
        senders = self._senders()
        if senders <= 0 or sender is None:
            return True
        if not (type(sender) is int and 0 <= sender < senders):
            return False  # no rank of this world: a forged source (plaintext)
        if charge is None:  # nothing waiting from it: one value of any size fits
            return (
                self.max_bytes is None
                or size <= self.max_bytes // senders
                or size <= self._spare(sender, senders)  # in room others' shares leave
            )
        if charge[0] + 1 > max(1, self.max_entries // senders):
            return False
        return self.max_bytes is None or charge[1] + size <= self.max_bytes // senders

    def _spare(self, sender: Hashable, senders: int) -> int:
        """Bytes ``sender`` may take past its share: the room left once every other rank
        that sends (all but ``sender`` and this one) has the rest of its share kept free.
        Any value within a sender's share then always fits the bound over all senders."""
        assert self.max_bytes is not None
        share = self.max_bytes // senders
        owed = 0
        for rank in range(senders):
            if rank != sender and rank != self._own:
                charge = self._charges.get(rank)
                owed += share - min(share, charge[1]) if charge is not None else share
        return self.max_bytes - self.nbytes - owed

    def take(
        self,
        key: K,
        deadline: float,
        timeout_message: str,
        *,
        stop: Callable[[], str | None] | None = None,
        job: str = "",
        pump: Callable[[float], bool] | None = None,
        takes: Callable[[], Container[Hashable]] | None = None,
    ) -> Any:
        """The next value for ``key``: waits at most until ``deadline``.

        A group not open (never opened, or pushed out of the memory of open groups by
        newer ones: a driver's 4,096 queued jobs) is opened here, as the waiting thread's
        work is real: with the slots ``takes()`` gives, the same its ``open`` was given,
        so a reopened job's group still refuses every key its program does not take
        (review w32, B3); without ``takes``, with any key (a lane).

        Raises JobAbortedError when the group is closed, or ``stop()`` gives a reason (it
        is asked again on every :meth:`wake`); MplTimeoutError with ``timeout_message`` at
        the deadline. ``pump(seconds)`` reads the socket for a while if nobody else is
        reading it (False then): the waiting thread takes its value straight off the socket
        instead of being woken by the receiving thread.
        """
        group = self._group_of(key)
        while True:
            with self._cond:
                # a thread waits for it: the group is real (asked at every wake: newer
                # groups may push it out again while the thread waits, and every open
                # that pushes one out wakes the waiters)
                if group not in self._open and group not in self._closed:
                    self._open_group(group, _ANY if takes is None else takes())
                queue = self._items.get(key)
                if queue:
                    value, size, sender = queue.popleft()
                    self.entries -= 1
                    self.nbytes -= size
                    self._uncharge(sender, size)
                    if not queue:
                        del self._items[key]
                        if not self._once:
                            self._keys.get(group, set()).discard(key)
                    return value
                reason = self._closed.get(group)
                if not reason and stop is not None:
                    reason = stop()
                if reason:
                    raise JobAbortedError(reason, job=job)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MplTimeoutError(timeout_message)
                if pump is None:
                    self._cond.wait(left)
                    continue
            if not pump(min(left, 0.05)):  # another thread reads the socket: let it
                with self._cond:
                    if key not in self._items:
                        self._cond.wait(0.002)


def _job_of(key: MoveKey) -> tuple[str, str]:
    return key[0], key[1]


def _slot_of(key: MoveKey) -> MoveSlot:
    return key[2], key[3], key[4]  # op, seq, src: what worker/move_keys.py lists


def _move_src(key: MoveKey) -> Hashable:
    return key[4]


def _lane_of(key: SpuKey) -> str:
    return key[0]


def _spu_src(key: SpuKey) -> Hashable:
    return key[1]


def move_mailbox(
    holding: Holding | None = None, *, max_entries: int | None = None
) -> KeyedMailbox[MoveKey, tuple[str, str]]:
    """Peer moves: grouped by (session, job), each key delivered once, a job's group
    keeping only the moves its program takes (``open`` with ``move_keys.moves_in``);
    bounded in entries (MAX_MOVES_PENDING, each sender its share) but not bytes, since one
    genuine move may be as big as the job's data: the program bounds how many a job
    takes."""
    from mpl.wire import limits

    entries = limits.MAX_MOVES_PENDING if max_entries is None else max_entries
    return KeyedMailbox(
        _job_of,
        once=True,
        max_entries=entries,
        holding=holding,
        slot_of=_slot_of,
        sender_of=_move_src,
    )


def spu_mailbox(
    holding: Holding | None = None,
    *,
    max_entries: int | None = None,
    max_bytes: int | None = None,
    own: int | None = None,
) -> KeyedMailbox[SpuKey, str]:
    """libspu's messages: grouped by lane, first in first out per key; bounded in entries
    and bytes (MAX_SPU_PENDING, MAX_SPU_PENDING_BYTES), each sender its share (``own``:
    this worker's rank, which sends it nothing)."""
    from mpl.wire import limits

    return KeyedMailbox(
        _lane_of,
        once=False,
        max_entries=limits.MAX_SPU_PENDING if max_entries is None else max_entries,
        max_bytes=limits.MAX_SPU_PENDING_BYTES if max_bytes is None else max_bytes,
        holding=holding,
        size=len,
        sender_of=_spu_src,
        own=own,
    )
