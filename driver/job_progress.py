"""Progress of the driver's jobs in flight: the numbers, and a bar on a terminal.

Workers report where each rank of a long job is (``mpl.wire.progress.Progress``); the
client hands every report to its :class:`ProgressBoard`. The board keeps the numbers for
``ctx.status()`` and for whoever watches a job (a Future, say, through :meth:`watch`), and
draws one tqdm line per job that has run for :data:`BAR_AFTER_S`, showing the slowest
rank, when stderr is a terminal. ``mp.progress(False)`` or ``MPL_PROGRESS=0`` turns the
bar off; the numbers are kept either way.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpl.wire.printable import one_line
from mpl.wire.progress import Progress

__all__ = [
    "BAR_AFTER_S",
    "MAX_BOARD_RANKS",
    "JobProgress",
    "ProgressBoard",
    "bars_enabled",
    "progress",
]

BAR_AFTER_S = 1.0  # jobs shorter than this never show a bar
_REMEMBERED = 4096  # jobs in flight tracked per client (one that ends unseen is forgotten)
# (job, rank) reports kept over all jobs in flight: a report names any rank (the broker's
# word), so without it a broker grows the board by one entry per report
MAX_BOARD_RANKS = 16384

_enabled: bool | None = None  # None: follow MPL_PROGRESS (default on)


def progress(enabled: bool | None = None) -> bool:
    """Turn progress bars on or off for this process (``None``: just ask); returns the
    setting now. Bars show only when stderr is a terminal; ``MPL_PROGRESS=0`` is the default
    off switch."""
    global _enabled
    if enabled is not None:
        _enabled = bool(enabled)
    if _enabled is not None:
        return _enabled
    return os.environ.get("MPL_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


def bars_enabled() -> bool:
    stream = sys.stderr
    return progress() and stream is not None and stream.isatty()


@dataclass
class JobProgress:
    """Where one job is: per rank, ``(ops done, ops total, op running now)``."""

    job: str
    started: float = field(default_factory=time.monotonic)
    ranks: dict[int, tuple[int, int, str]] = field(default_factory=dict)

    def slowest(self) -> tuple[int, int, int, str] | None:
        """``(rank, done, total, op)`` of the rank least far along, or None before any report."""
        if not self.ranks:
            return None
        rank, (done, total, op) = min(
            self.ranks.items(), key=lambda kv: (kv[1][0] / max(kv[1][1], 1), kv[0])
        )
        return rank, done, total, op

    def to_dict(self) -> dict[str, Any]:
        slow = self.slowest()
        return {
            "job": self.job,
            "elapsed_s": time.monotonic() - self.started,
            "rank": slow[0] if slow else None,
            "done": slow[1] if slow else 0,
            "total": slow[2] if slow else 0,
            "op": slow[3] if slow else "",
            "ranks": {r: {"done": d, "total": t, "op": o} for r, (d, t, o) in self.ranks.items()},
        }


class _Bar:
    """One tqdm line for one job (tqdm is imported when the first bar is drawn)."""

    def __init__(self, job: str, elapsed: float) -> None:
        from tqdm import tqdm

        # a terminal that reports no size (a fresh pty says 0 x 0) would hide the bar
        size = shutil.get_terminal_size((100, 24))
        self.bar = tqdm(
            total=None,
            desc=f"mpl job {job}",
            unit="op",
            leave=True,
            ncols=size.columns or 100,
            nrows=size.lines or 24,
        )
        self.bar.start_t -= elapsed  # rates and times count from the job's start

    def show(self, p: JobProgress) -> None:
        slow = p.slowest()
        if slow is None:
            self.bar.refresh()
            return
        rank, done, total, op = slow
        self.bar.total = total
        self.bar.n = done
        self.bar.set_postfix_str(f"rank {rank}: {op}", refresh=False)
        self.bar.refresh()

    def finish(self, ok: bool) -> None:
        if ok and self.bar.total:
            self.bar.n = self.bar.total
            self.bar.set_postfix_str("done", refresh=False)
            self.bar.refresh()
        self.bar.close()


class ProgressBoard:
    """The progress of one client's jobs in flight; safe to use from any thread.

    A job in flight costs one entry (its start time) until a report about it arrives or
    someone asks for it: its :class:`JobProgress` is built only then, so the many short jobs
    that never report build nothing per job.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # jobs in flight: start time, oldest first (one that ends unseen is dropped past
        # _REMEMBERED)
        self._started: dict[str, float] = {}
        self._jobs: dict[str, JobProgress] = {}  # only jobs someone reported on or asked for
        self._bars: dict[str, _Bar] = {}
        self._watchers: dict[str, list[Callable[[JobProgress], None]]] = {}
        self._ranks = 0  # (job, rank) entries over every JobProgress in _jobs

    def begin(self, job: str) -> None:
        """A job was submitted."""
        # One dict item set, atomic under the GIL: begin and end run once per job and take
        # no lock. Whoever adds to _jobs, _watchers or _bars (under the lock) looks again
        # whether the job is still in _started afterwards, and end looks at those tables
        # after taking the job out of _started: one of the two always sees the other.
        # (mpl.driver.job_site writes begin and end out, with these same steps.)
        started = self._started
        started[job] = time.monotonic()
        if len(started) > _REMEMBERED:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        started = self._started
        with self._lock:
            while len(started) > _REMEMBERED:
                try:
                    oldest = next(iter(started))
                except RuntimeError:  # another thread's begin or end changed it: again
                    continue
                except StopIteration:
                    return
                started.pop(oldest, None)
                self._drop(oldest)
                self._watchers.pop(oldest, None)

    def _progress(self, job: str) -> JobProgress | None:
        """The job's progress record, built on first need (call with the lock held)."""
        p = self._jobs.get(job)
        if p is None:
            started = self._started.get(job)
            if started is None:
                return None  # a job that already ended, or not ours
            p = self._jobs[job] = JobProgress(job, started)
            if job not in self._started:  # it ended meanwhile (end takes no lock)
                del self._jobs[job]
                return None
        return p

    def _drop(self, job: str) -> None:
        """Forget ``job``'s record and its entries' count (call with the lock held)."""
        p = self._jobs.pop(job, None)
        if p is not None:
            self._ranks -= len(p.ranks)

    def update(self, msg: Progress) -> None:
        """A report arrived (from whichever thread received it).

        Everything in it is the broker's word, unauthenticated (a party's worker's, relayed):
        its op is shown escaped and cut to one short line (it is drawn on the terminal), and
        a report naming a rank new to the board is dropped once the board holds
        MAX_BOARD_RANKS of them (its ``rank`` may be any int)."""
        with self._lock:
            p = self._progress(msg.job)
            if p is None:
                return
            ranks = p.ranks
            if msg.rank not in ranks:
                if self._ranks >= MAX_BOARD_RANKS:
                    return
                self._ranks += 1
            ranks[msg.rank] = (msg.done, msg.total, one_line(msg.op))
            watchers = list(self._watchers.get(msg.job, ()))
        for watch in watchers:
            watch(p)
        self._draw(p)

    def tick(self, job: str) -> None:
        """A thread waiting for ``job`` woke: a bar appears once the job runs long enough,
        even before any report (one long op sends none)."""
        started = self._started.get(job)
        if started is None or time.monotonic() - started < BAR_AFTER_S:
            return
        with self._lock:
            p = self._progress(job)
        if p is not None:
            self._draw(p)

    def end(self, job: str, ok: bool) -> None:
        """The job's answer arrived."""
        self._started.pop(job, None)
        if self._jobs or self._watchers or self._bars:  # only a job someone looked at
            with self._lock:
                self._drop(job)
                self._watchers.pop(job, None)
                bar = self._bars.pop(job, None)
            if bar is not None:
                bar.finish(ok)

    def get(self, job: str) -> JobProgress | None:
        with self._lock:
            return self._progress(job)

    def watch(self, job: str, callback: Callable[[JobProgress], None]) -> None:
        """Call ``callback(progress)`` on every report for ``job`` until it ends."""
        with self._lock:
            if job in self._started:
                self._watchers.setdefault(job, []).append(callback)
                if job not in self._started:  # it ended meanwhile (end takes no lock)
                    self._watchers.pop(job, None)

    def running(self) -> dict[str, dict[str, Any]]:
        """Every job in flight as plain numbers (``ctx.status()["progress"]``)."""
        with self._lock:
            jobs = [self._progress(job) for job in self._started]
            return {p.job: p.to_dict() for p in jobs if p is not None}

    def _draw(self, p: JobProgress) -> None:
        bar = self._bars.get(p.job)
        if bar is None:
            if time.monotonic() - p.started < BAR_AFTER_S or not bars_enabled():
                return
            with self._lock:
                if p.job not in self._started:
                    return
                bar = self._bars.get(p.job)
                if bar is None:
                    bar = self._bars[p.job] = _Bar(p.job, time.monotonic() - p.started)
                    if p.job not in self._started:  # it ended meanwhile (end takes no lock)
                        del self._bars[p.job]
                        bar.finish(False)
                        return
        bar.show(p)
