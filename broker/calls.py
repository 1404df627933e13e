"""Calls in flight: jobs and other fanned-out requests, gathered into one answer each.

A call has a driver waiting on it and a set of ranks still owing an answer. The first
failure (or the loss of a rank it needs) ends it at once; otherwise it ends when the last
rank answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SymbolInfo

__all__ = ["Call", "CallTable", "JobCall", "RequestCall"]


@dataclass
class Call:
    driver: bytes
    session: str
    ranks: tuple[int, ...]
    pending: set[int]


@dataclass(init=False, eq=False)
class JobCall(Call):
    """A job in flight: made once per job, so its ``__init__`` is written out (the
    dataclass's, with a factory call per dict, cost twice as much)."""

    job: str
    sender: str  # the driver identity that sent the Exec (authenticated in secure mode)
    values: dict[int, dict[int, Any]]
    stats: dict[int, Any]  # each rank's stats blob, unread (mpl.wire.run_stats)
    metas: dict[int, str]
    progress_sent: dict[int, float]  # rank -> last forwarded
    saved: dict[str, dict[int, SymbolInfo]]  # name -> reports
    # The decoded Dones' values and stats as the bytes they came in (mpl.wire.hot), spliced
    # into the JobResult; None once a Done came with buffer frames or was read lean (then
    # the answer is encoded, or packed when every Done was read lean: ``lean``).
    raw_values: dict[int, dict[int, bytes]] | None
    raw_stats: dict[int, bytes]
    # Whether every Done so far was read by mpl.wire.hot.read_done: plain msgpack values
    # and stats, which the answer is packed from in one call (mpl.wire.hot.packed_result)
    lean: bool

    def __init__(
        self,
        driver: bytes,
        session: str,
        ranks: tuple[int, ...],
        pending: set[int],
        job: str,
        sender: str = "",
    ) -> None:
        self.driver, self.session, self.ranks, self.pending = driver, session, ranks, pending
        self.job, self.sender = job, sender
        self.values, self.stats, self.metas = {}, {}, {}
        self.progress_sent, self.saved, self.raw_values, self.raw_stats = {}, {}, {}, {}
        self.lean = True


@dataclass
class RequestCall(Call):
    """A driver request answered by one or more workers: fetch, save or delete a name."""

    req: int = 0  # the driver's request number
    bid: int = 0  # the broker's request number, sent to the workers
    kind: str = ""  # "fetch" | "save" | "unsave"
    symbol: SymbolInfo | None = None


class CallTable:
    """Jobs by id and requests by broker request number."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobCall] = {}
        self.requests: dict[int, RequestCall] = {}
        self._next_req = 0

    def new_req(self) -> int:
        self._next_req += 1
        return self._next_req

    def involving(self, rank: int) -> list[JobCall | RequestCall]:
        calls: list[JobCall | RequestCall] = [j for j in self.jobs.values() if rank in j.pending]
        calls += [r for r in self.requests.values() if rank in r.pending]
        return calls

    def of_session(self, sid: str) -> list[JobCall]:
        return [j for j in self.jobs.values() if j.session == sid]


def lost_rank_error(rank: int, reason: str, job: str = "") -> ErrorInfo:
    return ErrorInfo(
        "WorkerLostError",
        f"rank {rank} was lost ({reason}); the other ranks of the call were released",
        rank=rank,
        job=job,
    )
