"""What the broker remembers about jobs for its metrics and status page. No I/O.

The shell shows it every message it decodes (:meth:`JobLedger.received`) and every message
it sends (:meth:`JobLedger.sent`): a job starts with its ``Exec`` and ends with the one
``JobResult`` the broker answers it with. From that come the job counters by outcome, the
job-duration histogram, jobs per second, and the last jobs per rank for the timeline.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Exec, JobResult
from mpl.wire.record import Record
from mpl.wire.run_stats import TIMES_BYTES, read_times, stats_blob

__all__ = ["BUCKETS", "OUTCOMES", "JobLedger", "JobSpan", "outcome_of"]

# Seconds; the jobs people run here range from a millisecond round trip to long MPC jobs.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           60.0, 300.0)  # fmt: skip
# A label value per outcome: a fixed set, whatever error kind a peer writes (label
# cardinality must not follow network input).
OUTCOMES = ("ok", "failed", "worker_lost", "aborted", "timeout", "rejected")
_KIND_OUTCOME = {
    "WorkerLostError": "worker_lost",
    "JobAbortedError": "aborted",
    "MplTimeoutError": "timeout",
    "SessionError": "rejected",
    "ProtocolError": "rejected",
    "AuthenticationError": "rejected",
}
_STARTED_LIMIT = 65536  # jobs in flight remembered; beyond it the oldest start is forgotten
_RATE_WINDOW_S = 10.0
_new = object.__new__
# what a span may keep of its stats blobs whole: the answer's header they came in, at most
# (a trivial job's at 16 ranks is about 1 KiB); the last 200 jobs' then hold 1.6 MiB at most
_WHOLE_BYTES = 8 * 1024


def outcome_of(result: JobResult) -> str:
    if result.error is None:
        return "ok"
    return _KIND_OUTCOME.get(result.error.kind, "failed")


def _heads(stats: Mapping[int, Any]) -> dict[int, bytes]:
    """Each rank's stats blob cut to its first TIMES_BYTES (an ``Opaque`` frame, from a
    decoded Done, read as bytes first)."""
    return {r: (stats_blob(blob) or b"")[:TIMES_BYTES] for r, blob in stats.items()}


class JobSpan:
    """One finished job, as the timeline draws it.

    Its ranks' parts are worked out when first read (the page and the log read few of the
    jobs the broker ends), from the first :data:`TIMES_BYTES` of each rank's stats blob:
    all the timeline reads of it, and all the span keeps (a rank may send 256 KiB of
    stats per job; the last 200 jobs' whole blobs were ~50 MiB per rank held).
    """

    __slots__ = ("_parts", "_stats", "job", "outcome", "seconds", "session", "started")

    def __init__(
        self,
        job: str,
        session: str,
        started: float,
        seconds: float,
        outcome: str,
        ranks: dict[int, tuple[float, float]] | tuple[tuple[int, ...], Mapping[int, Any]],
    ) -> None:
        self.job = job
        self.session = session
        self.started = started  # wall clock at the broker
        self.seconds = seconds
        self.outcome = outcome
        # rank -> (wall start, seconds) of its part; or (ranks, each rank's blob's first
        # TIMES_BYTES) to work that out from
        self._parts = ranks if isinstance(ranks, dict) else None
        self._stats = None if isinstance(ranks, dict) else ranks

    @property
    def ranks(self) -> dict[int, tuple[float, float]]:
        """rank -> (wall start, seconds) of its part of the job."""
        if self._parts is None:
            assert self._stats is not None
            ranks, stats = self._stats
            parts: dict[int, tuple[float, float]] = {}
            for rank in ranks:
                try:  # the times a rank sent, read now (they are checked on reading)
                    parts[rank] = read_times(stats[rank])
                except (KeyError, ProtocolError):
                    # failed jobs carry no per-rank stats, and a rank's may be unreadable:
                    # draw the broker's view
                    parts[rank] = (self.started, self.seconds)
            self._parts, self._stats = parts, None
        return self._parts

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "session": self.session,
            "started": self.started,
            "seconds": self.seconds,
            "outcome": self.outcome,
            "ranks": {str(r): list(span) for r, span in self.ranks.items()},
        }


class JobLedger:
    """Job counts, durations and the last ``recent`` jobs, fed by the broker's shell."""

    def __init__(self, recent: int = 200, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.bucket_counts = [0] * len(BUCKETS)  # not cumulative: job count per bucket
        self.seconds_sum = 0.0
        self.count = 0
        self.recent: deque[JobSpan] = deque(maxlen=recent)
        self._ends: deque[float] = deque(maxlen=100_000)
        # job -> (monotonic start, session, ranks): a plain dict in arrival order, its
        # oldest entry dropped past the limit (nothing reorders it, so that is the LRU's)
        self._started: dict[str, tuple[float, str, tuple[int, ...]]] = {}

    def received(self, msg: Record, now: float | None = None) -> None:
        """Note a message the broker received (at ``now`` on :attr:`clock`, if the caller
        has read it already)."""
        if type(msg) is Exec:
            started = self._started
            if msg.job not in started:
                if len(started) >= _STARTED_LIMIT:
                    del started[next(iter(started))]
                started[msg.job] = (self.clock() if now is None else now, msg.session, msg.ranks)

    def sent(
        self,
        msg: Record,
        frames: Sequence[Any] | None = None,
        clocks: tuple[float, float] | None = None,
    ) -> JobSpan | None:
        """Note a message the broker sends (``frames``: as it went, if known); the finished
        job if it answers one (once per job: written in one method, outcome_of inline for a
        job that succeeded). ``clocks``: :attr:`clock` and the wall clock as the caller read
        them when it sent this (once for all it sent together), else read here."""
        if type(msg) is not JobResult or msg.missing_program:
            return None
        if clocks is None:
            now, wall = self.clock(), time.time()
        else:
            now, wall = clocks
        start = self._started.pop(msg.job, None)
        outcome = "ok" if msg.error is None else outcome_of(msg)
        self.outcomes[outcome] += 1
        self._ends.append(now)
        if start is None:  # an Exec we never saw (forgotten, or answered before it counted)
            return None
        mono, session, ranks = start
        seconds = now - mono
        self.count += 1
        self.seconds_sum += seconds
        bucket = bisect_left(BUCKETS, seconds)  # the first bound at or above it
        if bucket < len(BUCKETS):
            self.bucket_counts[bucket] += 1
        stats = msg.stats
        # An answer sent as one short header holds its blobs: the span keeps them as they
        # are (at most _WHOLE_BYTES a span, no work per rank on a trivial job's way out).
        # Any other is cut to each blob's first TIMES_BYTES, all the timeline reads.
        if frames is None or len(frames) != 2 or len(frames[1]) > _WHOLE_BYTES:
            stats = _heads(stats)
        # JobSpan(msg.job, session, wall - seconds, seconds, outcome, (ranks, stats)), its
        # slots filled without __init__ (one span per job): its parts worked out when read
        span = _new(JobSpan)
        span.job, span.session, span.started = msg.job, session, wall - seconds
        span.seconds, span.outcome = seconds, outcome
        span._parts, span._stats = None, (ranks, stats)
        self.recent.append(span)
        return span

    def jobs_per_second(self, window_s: float = _RATE_WINDOW_S) -> float:
        now = self.clock()
        ended = 0
        for t in reversed(self._ends):
            if now - t > window_s:
                break
            ended += 1
        return ended / window_s

    def snapshot(self) -> dict[str, Any]:
        """A copy that another thread may read while the broker goes on."""
        return {
            "outcomes": dict(self.outcomes),
            "buckets": list(zip(BUCKETS, self.bucket_counts, strict=True)),
            "seconds_sum": self.seconds_sum,
            "seconds_count": self.count,
            "jobs_per_second": self.jobs_per_second(),
            "recent": [span.to_dict() for span in self.recent],
        }
