"""Where peer moves wait for the op that needs them: exactly once, in any arrival order.

A move is keyed by (session, job, op, seq, src). The first copy is kept and later copies
are discarded; a move for a job that already ended is dropped. A waiting op wakes when its
move arrives, when its job is aborted (``JobAbortedError``) or at its deadline
(``MplTimeoutError``): never later.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mpl.wire.errors import JobAbortedError, MplTimeoutError
from mpl.wire.limits import MAX_MOVES_PENDING
from mpl.wire.lru import LRU

__all__ = ["Mailbox", "MoveKey"]

MoveKey = tuple[str, str, int, int, int]  # session, job, op, seq, src
JobKey = tuple[str, str]
_ENDED_MEMORY = 4096  # ended jobs remembered, to drop their late or duplicate moves


class Mailbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: dict[MoveKey, Any] = {}
        self._seen: dict[JobKey, set[MoveKey]] = {}
        self._aborted: LRU[JobKey, str] = LRU(_ENDED_MEMORY)
        self._ended: LRU[JobKey, bool] = LRU(_ENDED_MEMORY)
        self.duplicates = 0
        self.dropped = 0  # refused: too many moves waiting (mpl.wire.limits)

    def deliver(self, key: MoveKey, value: Any) -> bool:
        """Store an arriving move; False when it is a duplicate or its job has ended."""
        job = key[:2]
        with self._cond:
            if job in self._ended or job in self._aborted:
                self.duplicates += 1
                return False
            seen = self._seen.setdefault(job, set())
            if key in seen:
                self.duplicates += 1
                return False
            if len(self._items) >= MAX_MOVES_PENDING:  # moves for jobs that never come
                self.dropped += 1
                return False
            seen.add(key)
            self._items[key] = value
            self._cond.notify_all()
            return True

    def take(self, key: MoveKey, deadline: float, what: str = "") -> Any:
        """Wait for ``key``; raise JobAbortedError or MplTimeoutError instead of hanging."""
        job = key[:2]
        with self._cond:
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
            for job in {k[:2] for k in self._items} | set(self._seen):
                if job[0] == session:
                    self._aborted[job] = reason
                    self._drop(job)
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def _drop(self, job: JobKey) -> None:
        for key in self._seen.pop(job, ()):
            self._items.pop(key, None)
