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
* **Bounds.** Values waiting in open groups are bounded in entries and, optionally, bytes;
  beyond either a new one is dropped and counted in ``overflow`` (the run that needed it
  then fails at its deadline).
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
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from mpl.wire.errors import JobAbortedError, MplTimeoutError
from mpl.wire.lru import LRU
from mpl.worker.holding import Holding, approx_nbytes

__all__ = ["KeyedMailbox", "MoveKey", "SpuKey", "move_mailbox", "spu_mailbox"]

K = TypeVar("K", bound=Hashable)
G = TypeVar("G", bound=Hashable)
MoveKey = tuple[str, str, int, int, int, str]  # session, job, op, seq, src, sealer
SpuKey = tuple[str, int, str]  # lane, src, libspu key
_MEMORY = 4096  # closed or ended groups remembered, to drop their late traffic


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
    ) -> None:
        self._group_of = group_of
        self._once = once
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size = size if max_bytes is not None else (lambda _value: 0)
        self._cond = threading.Condition()
        self._items: dict[K, collections.deque[tuple[Any, int]]] = {}
        self._keys: dict[G, set[K]] = {}  # per group: keys with values (and, once, seen)
        self._open: LRU[G, bool] = LRU(memory)
        self._closed: LRU[G, str] = LRU(memory)  # why; "" when it ended normally
        self._held = holding or Holding()
        self._arrivals = 0  # tells apart held values that share a key
        self.entries = 0  # values waiting in open groups, and their bytes
        self.nbytes = 0
        self.duplicates = 0  # a key delivered twice (``once`` only)
        self.late = 0  # for groups already closed or ended
        self.overflow = 0  # refused: the bounds were reached

    # -- counters -------------------------------------------------------------------------
    @property
    def held_dropped(self) -> int:
        """Traffic for groups never opened that did not fit in the holding area or expired."""
        return self._held.dropped

    @property
    def dropped(self) -> int:
        """Everything refused for lack of room or purpose: held, overflow and late."""
        return self._held.dropped + self.overflow + self.late

    def held(self) -> int:
        with self._cond:
            return self._held.entries

    def pending(self) -> tuple[int, int]:
        """Values waiting for their taker, and their bytes (0 when bytes are not bounded)."""
        with self._cond:
            return self.entries, self.nbytes

    # -- groups ---------------------------------------------------------------------------
    def open(self, group: G) -> None:
        """The worker runs this group's work: accept its traffic, including what is held."""
        with self._cond:
            self._open_group(group)

    def _open_group(self, group: G) -> None:
        if group in self._open or group in self._closed:
            return
        self._open[group] = True
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
        for key in self._keys.pop(group, ()):
            queue = self._items.pop(key, None)
            if queue:
                self.entries -= len(queue)
                self.nbytes -= sum(size for _value, size in queue)

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
        keys = self._keys.setdefault(group, set())
        if self._once and key in keys:
            self.duplicates += 1
            return False
        size = self._size(value)
        if self.entries >= self.max_entries or (
            self.max_bytes is not None and self.nbytes + size > self.max_bytes
        ):
            self.overflow += 1
            return False
        keys.add(key)
        self._items.setdefault(key, collections.deque()).append((value, size))
        self.entries += 1
        self.nbytes += size
        return True

    def take(
        self,
        key: K,
        deadline: float,
        timeout_message: str,
        *,
        stop: Callable[[], str | None] | None = None,
        job: str = "",
        pump: Callable[[float], bool] | None = None,
    ) -> Any:
        """The next value for ``key``: waits at most until ``deadline``.

        Raises JobAbortedError when the group is closed, or ``stop()`` gives a reason (it
        is asked again on every :meth:`wake`); MplTimeoutError with ``timeout_message`` at
        the deadline. ``pump(seconds)`` reads the socket for a while if nobody else is
        reading it (False then): the waiting thread takes its value straight off the socket
        instead of being woken by the receiving thread.
        """
        group = self._group_of(key)
        with self._cond:
            self._open_group(group)  # a thread waits for it: the group is real
        while True:
            with self._cond:
                queue = self._items.get(key)
                if queue:
                    value, size = queue.popleft()
                    self.entries -= 1
                    self.nbytes -= size
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


def _lane_of(key: SpuKey) -> str:
    return key[0]


def move_mailbox(
    holding: Holding | None = None, *, max_entries: int | None = None
) -> KeyedMailbox[MoveKey, tuple[str, str]]:
    """Peer moves: grouped by (session, job), each key delivered once; bounded in entries
    (MAX_MOVES_PENDING) but not bytes, since one genuine move may be as big as the job's
    data."""
    from mpl.wire import limits

    entries = limits.MAX_MOVES_PENDING if max_entries is None else max_entries
    return KeyedMailbox(_job_of, once=True, max_entries=entries, holding=holding)


def spu_mailbox(
    holding: Holding | None = None,
    *,
    max_entries: int | None = None,
    max_bytes: int | None = None,
) -> KeyedMailbox[SpuKey, str]:
    """libspu's messages: grouped by lane, first in first out per key; bounded in entries
    and bytes (MAX_SPU_PENDING, MAX_SPU_PENDING_BYTES)."""
    from mpl.wire import limits

    return KeyedMailbox(
        _lane_of,
        once=False,
        max_entries=limits.MAX_SPU_PENDING if max_entries is None else max_entries,
        max_bytes=limits.MAX_SPU_PENDING_BYTES if max_bytes is None else max_bytes,
        holding=holding,
        size=len,
    )
