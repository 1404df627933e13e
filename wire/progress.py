"""Progress of a running job: where each rank is, sent while the job runs.

::

    worker (rank R)               broker                        driver
      | -- Progress ------------>  | -- Progress (same job) -->  |  bar, ctx.status(), futures

A rank reports the ops it has finished out of the ops it runs, and the op it runs now. It
reports nothing during a job's first half second and then at most a few times a second
(:data:`FIRST_AFTER_S`, :data:`EVERY_S`), so short jobs cost nothing. The broker forwards a
report only from the worker that serves the rank it names, only for a job in flight that
involves that rank, and at most every :data:`EVERY_S` per job and rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpl.wire.record import Record

__all__ = ["EVERY_S", "FIRST_AFTER_S", "Progress"]

FIRST_AFTER_S = 0.5  # no report before a job has run this long
EVERY_S = 0.25  # and then at most one per this interval, per job and rank


@dataclass(eq=False, repr=False)
class Progress(Record, tag="progress"):
    """Rank ``rank`` of ``job`` has finished ``done`` of its ``total`` ops and runs ``op``."""

    session: str
    job: str
    rank: int
    done: int
    total: int
    op: str = ""
