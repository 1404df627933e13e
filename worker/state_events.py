"""What goes into the worker's state machine and what comes out (``worker/state.py``).

Events are the broker's messages (already decoded and, in secure mode, opened records:
``Welcome``, ``Exec``, ``Abort``, ``SessionClosed``, ...) and the records below: timer
ticks, facts the I/O shell found while decoding, and reports of job threads. Actions are
what the shells do: send, run, wake, free, drop. The state decides; the threads and the
ZeroMQ shell (``jobs.py``, ``daemon.py``) only execute.

They are slotted, not frozen, dataclasses: a few are made for every job, and a frozen one
costs three times as much to make (treat them as values all the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpl.wire.data import Delete, Fetch
from mpl.wire.graph import Graph
from mpl.wire.jobs import Done, Exec
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo

__all__ = [
    "Action",
    "Beat",
    "CloseAll",
    "CloseSession",
    "CodeRefused",
    "DeleteNow",
    "DropLanes",
    "EndJob",
    "ExecUnloadable",
    "Expect",
    "FetchArrived",
    "FreeJob",
    "Joined",
    "MoveRefused",
    "Post",
    "ProgramUnloadable",
    "Reconnect",
    "ReplyNow",
    "Run",
    "RunAborted",
    "RunFailed",
    "RunFinished",
    "Send",
    "Stop",
    "StopWaits",
    "Submit",
    "TaskDone",
    "Tick",
    "Unanswered",
]

JobKey = tuple[str, str]  # session, job


# -- events besides the broker's records ------------------------------------------------
@dataclass(slots=True)
class Tick:
    """The I/O loop turned: hellos, heartbeats and the broker's silence are due by ``now``."""


@dataclass(slots=True)
class FetchArrived:
    """A ``Fetch``, with whether its value is in the store right now (then it is answered at
    once, even while a long job of its session runs)."""

    msg: Fetch
    stored: bool


@dataclass(slots=True)
class ProgramUnloadable:
    """A program whose functions do not unpickle here (a module this worker lacks)."""

    digest: str
    why: str


@dataclass(slots=True)
class CodeRefused:
    """``--code kernels`` refused a program holding pickles: its jobs fail with ``why``."""

    digest: str
    why: str


@dataclass(slots=True)
class ExecUnloadable:
    """A job whose inputs did not load here, or which the code policy refused."""

    session: str
    job: str
    error: ErrorInfo


@dataclass(slots=True)
class MoveRefused:
    """A peer's move for one of our jobs was refused (code policy): the job fails here."""

    session: str
    job: str
    error: ErrorInfo


@dataclass(slots=True)
class RunFinished:
    """A job thread (or the I/O thread, inline) ran the job; its outputs are stored."""

    session: str
    job: str
    seconds: float
    reply: Done


@dataclass(slots=True)
class RunFailed:
    session: str
    job: str
    seconds: float
    error: ErrorInfo


@dataclass(slots=True)
class RunAborted:
    """The run stopped (or never started) because the job was aborted or its session
    closed; nothing is owed to the broker."""

    session: str
    job: str
    seconds: float


@dataclass(slots=True)
class TaskDone:
    """A task handed to the job pool for ``session`` ended (whatever its outcome)."""

    session: str


# -- actions ------------------------------------------------------------------------------
@dataclass(slots=True)
class Send:
    """Send to the broker on the I/O thread's socket (control messages)."""

    msg: Record


@dataclass(slots=True)
class Post:
    """Send to the broker on the result channel (answers; from any thread)."""

    msg: Record


@dataclass(slots=True)
class Beat:
    """Send a heartbeat carrying the worker's counters."""


@dataclass(slots=True)
class Reconnect:
    reason: str


@dataclass(slots=True)
class Unanswered:
    """The broker has not answered this worker's hellos for ``seconds``: say so once per
    attempt to join (the worker keeps trying), so a wrong address or mode shows."""

    seconds: float


@dataclass(slots=True)
class Joined:
    """Welcomed by the broker; ``new_broker`` when it is not the one we knew (it restarted,
    so every session it ran is gone)."""

    broker_id: str
    new_broker: bool


@dataclass(slots=True)
class Stop:
    """Refused by the broker (the rank is taken, the key unknown): the worker exits."""

    error: ErrorInfo


@dataclass(slots=True)
class Run:
    """Run the job: on the I/O thread now (``inline``) or on the pool in session order."""

    msg: Exec
    graph: Graph
    inline: bool


@dataclass(slots=True)
class Submit:
    """Queue a session's task on the pool (a fetch, delete, save, or a late free)."""

    session: str
    msg: Record


@dataclass(slots=True)
class ReplyNow:
    """Answer the fetch from the store, on this thread."""

    msg: Fetch


@dataclass(slots=True)
class DeleteNow:
    """Free the values the delete names, on this thread (nothing of its session is queued
    or running on the pool, so it overtakes nothing)."""

    msg: Delete


@dataclass(slots=True)
class Expect:
    """Accept the job's moves (and hand over those held): the ``(op, seq, src)`` of each
    move its program takes here (``mpl.worker.move_keys.moves_in``), no other."""

    job: JobKey
    takes: frozenset[tuple[int, int, int]] = frozenset()


@dataclass(slots=True)
class StopWaits:
    """Wake everything the job waits on (moves, SPU messages, sends) with ``reason``."""

    job: JobKey
    reason: str


@dataclass(slots=True)
class EndJob:
    """The job is over here: free its leftover moves, drop its late ones."""

    job: JobKey


@dataclass(slots=True)
class FreeJob:
    """Free the job's outputs in the store."""

    job: JobKey


@dataclass(slots=True)
class DropLanes:
    """Drop the session's SPU lanes (every member does so at the same failed job)."""

    session: str


@dataclass(slots=True)
class CloseSession:
    """Free the session: its values, its moves and SPU messages, its lanes."""

    session: str
    reason: str


@dataclass(slots=True)
class CloseAll:
    """Close every session this worker holds anything of (the broker restarted)."""

    reason: str


Action = (
    Send
    | Post
    | Beat
    | Reconnect
    | Unanswered
    | Joined
    | Stop
    | Run
    | Submit
    | ReplyNow
    | DeleteNow
    | Expect
    | StopWaits
    | EndJob
    | FreeJob
    | DropLanes
    | CloseSession
    | CloseAll
)
