"""A job's view of the world while it runs on a job thread (the interpreter's JobContext).

``JobRun`` is what the interpreter calls for a job's moves (``send``/``recv`` through the
peer links and the keyed mailbox), its progress reports and its extensions; ``JobSealers``
is what it asks, in secure mode, for the driver that sealed the job here. Split from
``jobs.py`` (the job shell), which makes one ``JobRun`` per pooled run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from mpl.wire.data import Fetch, Move
from mpl.wire.errors import UnsafeValueError
from mpl.wire.graph import Graph
from mpl.wire.progress import EVERY_S, FIRST_AFTER_S, Progress
from mpl.wire.safe_values import unsafe
from mpl.wire.sessions import Reply, SymbolInfo
from mpl.worker.interpreter import op_label
from mpl.worker.move_keys import MoveSlot, moves_in

if TYPE_CHECKING:
    from mpl.worker.jobs import Jobs

__all__ = ["JobRun", "JobSealers"]


class JobSealers(Protocol):
    """Secure mode: who sealed each job opened here, and a fetch's value sealed for the
    driver that asked (``mpl.worker.sealing.WorkerSeal``)."""

    def recipient(self, session: str, job: str) -> str:
        """The driver that sealed the job here ("" none): its moves carry it."""

    def hold(self, session: str, job: str) -> str:
        """Keep the job's driver while the job pool holds the job (queued or running)."""

    def release(self, session: str, job: str) -> None:
        """The job pool is done with the job (its answer, if any, was sealed)."""

    def reply(self, fetch: Fetch, value: Any) -> Reply:
        """The Reply to ``fetch``, ``value`` sealed for the Fetch read here and answered,
        not for whatever the broker's req names by then (or an error, no value)."""


class JobRun:
    """A job's view of the world (the interpreter's JobContext)."""

    __slots__ = (
        "_jobs", "_reported", "deadline", "graph", "job", "next_report", "position", "rank",
        "saved", "sealer", "session", "spans", "started", "store",
    )  # fmt: skip

    def __init__(
        self, jobs: Jobs, session: str, job: str, deadline: float, started: float, graph: Graph
    ) -> None:
        self._jobs = jobs
        self.graph = graph  # the moves it takes, should its group need opening again
        self.session = session
        self.job = job
        self.rank = jobs.rank
        self.deadline = deadline
        self.started = started
        self.spans: list[list[Any]] = []
        self.store = jobs.store
        self.saved: list[SymbolInfo] = []  # by save ops; listed in Done
        self.next_report = started + FIRST_AFTER_S  # short jobs report nothing
        self.position: tuple[int, int, Graph, int] | None = None
        self._reported: tuple[int, int] | None = None
        # the driver that sealed this job here ("" in plaintext): its moves carry it and
        # only moves carrying it are taken (wire.data.Move)
        sealers = jobs.sealers
        self.sealer = sealers.recipient(session, job) if sealers is not None else ""

    def report(self, now: float) -> None:
        """Send where the job is if a report is due and says something new. Called by the
        interpreter at an op's start once one is due (job thread) and by the I/O thread, so
        a long op is reported too."""
        position = self.position
        if position is None or now < self.next_report:
            return
        done, total, graph, index = position
        if self._reported == (done, index):
            return
        self.next_report = now + EVERY_S
        self._reported = (done, index)
        label = op_label(graph, index)
        self._jobs.post(Progress(self.session, self.job, self.rank, done, total, label))

    def send(self, dst: int, op: int, seq: int, value: Any) -> None:
        move = Move(self.session, self.job, op, seq, self.rank, dst, value, self.sealer)
        try:
            self._jobs.peers.send(
                move, self.deadline, lambda: self._jobs.stopped((self.session, self.job))
            )
        except UnsafeValueError as exc:
            where = f"from rank {self.rank} to rank {dst} (a move for op {op} of job {self.job})"
            raise unsafe(exc.type_name or "value", where) from None

    def recv(self, src: int, op: int, seq: int) -> Any:
        key = (self.session, self.job, op, seq, src, self.sealer)
        late = (
            f"the move from rank {src} for op {op} did not arrive in time; the sender may be "
            "slow or dead, or the move was lost"
        )
        return self._jobs.mailbox.take(key, self.deadline, late, job=self.job, takes=self._takes)

    def _takes(self) -> frozenset[MoveSlot]:
        """What the job's Expect opened its group with (``WorkerState``): for a thread
        reopening the group, pushed out of the mailbox's memory by newer jobs."""
        return moves_in(self.graph, self.rank)

    def extension(self, name: str) -> Any:
        return self._jobs.extension(name)
