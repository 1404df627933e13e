"""Where peer moves wait for the op that needs them: exactly once, in any arrival order.

A move is keyed by (session, job, op, seq, src). The first copy is kept and later copies
are discarded; a move for a job that already ended is dropped. A waiting op wakes when its
move arrives, when its job is aborted (``JobAbortedError``) or at its deadline
(``MplTimeoutError``): never later.

Moves are accepted for the jobs this worker has been told about (:meth:`Mailbox.expect`,
when the broker's ``Exec`` arrives, or a job thread waiting for one). A move for any other
job may have overtaken its ``Exec``, or may be forged for a job that will never run: it
waits in a bounded :class:`~mpl.worker.holding.Holding` area until its job is announced,
and is dropped (counted) when that is full or the move is a few seconds old.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mpl.wire.errors import JobAbortedError, MplTimeoutError
from mpl.wire.limits import MAX_MOVES_PENDING
from mpl.wire.lru import LRU
from mpl.worker.holding import Holding

__all__ = ["Mailbox", "MoveKey"]

MoveKey = tuple[str, str, int, int, int]  # session, job, op, seq, src
JobKey = tuple[str, str]
_ENDED_MEMORY = 4096  # ended jobs remembered, to drop their late or duplicate moves


class Mailbox:
    def __init__(self, holding: Holding | None = None) -> None:
        self._cond = threading.Condition()
        self._items: dict[MoveKey, Any] = {}
        self._seen: dict[JobKey, set[MoveKey]] = {}
        self._known: LRU[JobKey, bool] = LRU(_ENDED_MEMORY)
        self._held = holding or Holding()
        self._aborted: LRU[JobKey, str] = LRU(_ENDED_MEMORY)
        self._ended: LRU[JobKey, bool] = LRU(_ENDED_MEMORY)
        self.duplicates = 0
        self.overflow = 0  # refused: too many moves waiting (mpl.wire.limits)

    @property
    def dropped(self) -> int:
        """Moves refused: for unknown jobs that did not fit in the holding area or expired
        there, or beyond MAX_MOVES_PENDING waiting for known jobs."""
        return self._held.dropped + self.overflow

    def held(self) -> int:
        with self._cond:
            return self._held.entries

    def expect(self, session: str, job: str) -> None:
        """This worker runs ``job``: accept its moves, including those already held."""
        with self._cond:
            self._expect((session, job))

    def _expect(self, job: JobKey) -> None:
        if job in self._known or job in self._ended or job in self._aborted:
            return
        self._known[job] = True
        for key, value in self._held.release(job):
            self._store(key, value)  # type: ignore[arg-type]
        self._cond.notify_all()

    def deliver(self, key: MoveKey, value: Any) -> bool:
        """Store an arriving move; False when it is a duplicate, its job has ended, or its
        job is unknown and the holding area has no room for it."""
        job = key[:2]
        with self._cond:
            if job in self._ended or job in self._aborted:
                self.duplicates += 1
                return False
            if job not in self._known:
                if self._held.holds(job, key):
                    self.duplicates += 1
                    return False
                return self._held.hold(job, key, value)
            if len(self._items) >= MAX_MOVES_PENDING:  # a flood of distinct keys for a real job
                self.overflow += 1
                return False
            if not self._store(key, value):
                self.duplicates += 1
                return False
            self._cond.notify_all()
            return True

    def _store(self, key: MoveKey, value: Any) -> bool:
        seen = self._seen.setdefault(key[:2], set())
        if key in seen:
            return False
        seen.add(key)
        self._items[key] = value
        return True

    def take(self, key: MoveKey, deadline: float, what: str = "") -> Any:
        """Wait for ``key``; raise JobAbortedError or MplTimeoutError instead of hanging."""
        job = key[:2]
        with self._cond:
            self._expect(job)  # a job thread waits for it: the job is real
            while True:
                if key in self._items:
                    return self._items.pop(key)
                reason = self._aborted.get(job)
                if reason is not None:
                    raise JobAbortedError(f"job {job[1]} aborted: {reason}", job=job[1])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MplTimeoutError(
                        f"{what or 'a peer move'} for op {key[2]} did not arrive in time; "
                        "the sender may be slow or dead, or the move was lost"
                    )
                self._cond.wait(left)

    def abort(self, session: str, job: str, reason: str) -> None:
        """Wake everything waiting on ``job`` with JobAbortedError and drop its moves."""
        with self._cond:
            self._aborted[(session, job)] = reason
            self._drop((session, job))
            self._cond.notify_all()

    def aborted(self, session: str, job: str) -> str | None:
        with self._cond:
            return self._aborted.get((session, job))

    def end(self, session: str, job: str) -> None:
        """The job finished here: drop its leftovers and ignore its late moves."""
        with self._cond:
            key = (session, job)
            self._aborted.pop(key, None)
            self._drop(key)
            self._ended[key] = True

    def close_session(self, session: str, reason: str) -> None:
        with self._cond:
            for job in {k[:2] for k in self._items} | set(self._seen) | set(self._known):
                if job[0] == session:
                    self._aborted[job] = reason
                    self._drop(job)
            self._held.forget(lambda job: job[0] == session)  # type: ignore[index]
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def _drop(self, job: JobKey) -> None:
        self._known.pop(job, None)
        self._held.release(job)
        for key in self._seen.pop(job, ()):
            self._items.pop(key, None)
