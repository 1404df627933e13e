"""The broker's memory of jobs that ended with ranks still to answer, each driver its share.

A job that fails or is cancelled before every rank answered is remembered (its driver, its
ranks, the ranks it still waits for) so that a late ``Done``'s saves are listed to that
driver (``broker/job_saves.py``). The memory is bounded (``ENDED_JOBS_KEPT`` entries), as
every table keyed by what peers send. Before, it was one LRU over all drivers: one driver
failing thousands of jobs pushed every other driver's entries out, and their late saves
were listed to no one. Now, when it is full, the entry that goes is the oldest of the
driver (by its authenticated identity) holding the most: a driver holding no more than an
equal share (the bound over the drivers holding entries) loses none of them to another's
failures, and a driver alone may use all of it.

Not thread-safe: the broker's one loop uses it.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["ENDED_JOBS_KEPT", "EndedJob", "EndedJobs"]

# Jobs that ended with ranks still to answer, kept for their late Dones' saves
ENDED_JOBS_KEPT = 4096

JobKey = tuple[str, str]  # session, job id
EndedJob = tuple[str, tuple[int, ...], set[int]]  # driver, ranks, ranks still to answer


class EndedJobs:
    """At most ``limit`` ended jobs by (session, job); when full, the oldest of the driver
    holding the most goes. Each operation costs the same whatever the table holds."""

    def __init__(self, limit: int = ENDED_JOBS_KEPT) -> None:
        self.limit = limit
        self.dropped = 0  # entries pushed out, for status
        self._jobs: dict[JobKey, EndedJob] = {}
        self._of: dict[str, dict[JobKey, None]] = {}  # driver -> its keys, oldest first
        # how many entries a driver holds -> the drivers holding that many, and the most
        # any holds: the driver to push out of is found without a search
        self._holding: dict[int, dict[str, None]] = {}
        self._most = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobKey]:
        return iter(self._jobs)

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def get(self, key: JobKey) -> EndedJob | None:
        return self._jobs.get(key)

    def held_by(self, driver: str) -> int:
        """How many entries ``driver``'s jobs hold."""
        return len(self._of.get(driver, ()))

    def __setitem__(self, key: JobKey, ended: EndedJob) -> None:
        if key in self._jobs:
            del self[key]
        elif len(self._jobs) >= self.limit:
            self._push_out()
        driver = ended[0]
        self._jobs[key] = ended
        keys = self._of.setdefault(driver, {})
        self._move(driver, len(keys), len(keys) + 1)
        keys[key] = None

    def __delitem__(self, key: JobKey) -> None:
        driver = self._jobs.pop(key)[0]
        keys = self._of[driver]
        del keys[key]
        self._move(driver, len(keys) + 1, len(keys))
        if not keys:
            del self._of[driver]

    def _push_out(self) -> None:
        """Drop the oldest entry of a driver holding the most."""
        driver = next(iter(self._holding[self._most]))
        del self[next(iter(self._of[driver]))]
        self.dropped += 1

    def _move(self, driver: str, held: int, now: int) -> None:
        """``driver`` held ``held`` entries and holds ``now`` (one more or one less)."""
        if held:
            drivers = self._holding[held]
            del drivers[driver]
            if not drivers:
                del self._holding[held]
        if now:
            self._holding.setdefault(now, {})[driver] = None
        if now > self._most:
            self._most = now
        elif held == self._most and held not in self._holding:
            self._most = now  # the one driver that held the most holds one less
