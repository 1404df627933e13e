"""The recipients of the jobs a worker's job pool holds (secure mode). No I/O.

``WorkerSeal`` remembers who sealed each job it opened, but only the last 4,096: a job that
waits long in the pool, or runs long, would lose the driver its moves must carry and its
Done is sealed for. So a job handed to the pool has its recipient held here, from the
hand-off until the pool is done with it.

Bounded per driver: past ``HELD_PER_DRIVER`` of one driver's jobs (a pool far behind) that
driver's oldest goes, never another driver's, so one driver's queued jobs cannot push out
another's. The drivers are those the node's spec lists, so the whole table is bounded too.
"""

from __future__ import annotations

import threading

__all__ = ["HELD_PER_DRIVER", "HeldRecipients"]

HELD_PER_DRIVER = 4096

JobKey = tuple[str, str]  # (session, job)


class HeldRecipients:
    """(session, job) -> the driver that sealed it, for the jobs the pool holds. Held and
    released under a lock (job threads release); :attr:`by_job` is read by single lookups
    from any thread, without it."""

    def __init__(self, per_driver: int = HELD_PER_DRIVER) -> None:
        self.by_job: dict[JobKey, str] = {}
        self.by_driver: dict[str, dict[JobKey, None]] = {}  # each driver's, oldest first
        self._per_driver = per_driver
        self._lock = threading.Lock()

    def hold(self, key: JobKey, driver: str) -> None:
        """Hold ``driver`` as job ``key``'s recipient, as the newest of that driver's."""
        with self._lock:
            self._let_go(key)  # (held again: as the newest, of its driver now)
            self.by_job[key] = driver
            mine = self.by_driver.get(driver)
            if mine is None:
                mine = self.by_driver[driver] = {}
            mine[key] = None
            if len(mine) > self._per_driver:  # this driver's oldest, never another's
                oldest = next(iter(mine))
                del mine[oldest]
                self.by_job.pop(oldest, None)

    def release(self, key: JobKey) -> None:
        """The pool is done with job ``key``: its recipient is held no longer. Any thread."""
        with self._lock:
            self._let_go(key)

    def _let_go(self, key: JobKey) -> None:
        driver = self.by_job.pop(key, None)
        if driver is not None:
            mine = self.by_driver[driver]
            del mine[key]
            if not mine:
                del self.by_driver[driver]
