"""The worker's decisions in one place, without I/O: ``WorkerState.handle(event, now)``.

Events are the broker's records and the reports of the worker's own threads
(``worker/state_events.py``); the result is a list of actions the shells execute: the
ZeroMQ shell (``daemon.py``) sends and reconnects, the job shell (``jobs.py``) runs jobs
on the pool or inline, wakes waits, frees values and drops SPU lanes. No sockets, no
threads, no clock reads: ``now`` is given, so tests drive it with an explicit clock.

What it keeps:

* **Joining** (what ``WorkerCore`` did): hellos with capped back-off until welcomed,
  heartbeats, a reconnect after ``liveness`` silent heartbeats, a fresh join when the
  broker asks (``Reregister``) or says goodbye. A welcome from a broker that is not the one
  we knew means it restarted: every session it ran is gone, so all are closed here too.
* **Programs**: cached under their digest only if the digest is that of the graph's own
  bytes (whoever relays programs cannot slip a different graph in under a digest that
  drivers' jobs name); bounded in entries and bytes. Programs that did not load here, or
  that the code policy refused, are remembered with the reason their jobs fail with.
* **Jobs and sessions**: jobs handed out and not yet reported back; tasks queued on the
  pool per session (a quick, purely local program runs inline, and a delete is done at
  once, only when its session has nothing queued, so arrival order holds); aborted jobs
  and closed sessions (their runs stop, their waits wake, their values are freed); per
  program, whether its last run here was quick.
* **SPU failures**: a failed or aborted job with SPU ops is counted once per session, and
  the session's lanes are dropped: every member does so at the same job, so lane ids stay
  in step (the count is part of the id).
"""

from __future__ import annotations

from typing import Any

from mpl.wire.control import (
    HEARTBEAT_LIVENESS,
    HEARTBEAT_S,
    Bye,
    Directory,
    PeerInfo,
    Refused,
    Reregister,
    Welcome,
    WorkerHello,
)
from mpl.wire.data import Delete
from mpl.wire.graph import Graph
from mpl.wire.jobs import Abort, Exec, Failed, Program, program_nbytes
from mpl.wire.kernels import KernelRef
from mpl.wire.limits import MAX_DIGEST_CHARS, MAX_MESSAGE, WORKER_PROGRAM_BYTES, heartbeat_ok
from mpl.wire.lru import LRU, SizedLRU
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import DeleteSymbol, SaveSymbol, SessionClosed
from mpl.worker.move_keys import MoveSlot, moves_in
from mpl.worker.state_events import (
    Action,
    Beat,
    CloseAll,
    CloseSession,
    CodeRefused,
    DeleteNow,
    DropLanes,
    EndJob,
    ExecUnloadable,
    Expect,
    FetchArrived,
    FreeJob,
    JobKey,
    Joined,
    MoveRefused,
    Post,
    ProgramUnloadable,
    Reconnect,
    ReplyNow,
    Run,
    RunAborted,
    RunFailed,
    RunFinished,
    Send,
    Stop,
    StopWaits,
    Submit,
    TaskDone,
    Tick,
    Unanswered,
)

__all__ = [
    "DELETE_NOW_MAX",
    "INLINE_OPCODES",
    "INLINE_RUN_S",
    "PROGRAM_SLOTS",
    "WorkerState",
    "is_local",
]

# At least the broker's mirror (its PROGRAM_SLOTS, and in bytes see mpl.wire.limits): an LRU
# fed the same sequence with more room holds everything the smaller one does.
PROGRAM_SLOTS = 512
INLINE_RUN_S = 0.001  # a program whose last run took at most this may run without hand-off
# Ops that neither wait on a peer nor reach outside the process.
INLINE_OPCODES = frozenset({"pcall", "constant", "getitem", "converge"})
_HELLO_FIRST, _HELLO_MAX = 0.05, 2.0  # quick retries while a broker starts up
# a broker silent to our hellos this long is worth a word: a wrong address or mode (a
# plaintext worker and a secure broker) otherwise looks exactly like a slow start
UNANSWERED_S = 5.0
_MEMORY = 1024  # closed sessions, aborted and SPU jobs, quick programs remembered
_NO_PROGRAM: tuple[str, Graph | None, int, tuple[str, bool, bool]] = (
    "",
    None,
    -1,
    ("", True, False),
)
# a delete naming at most this many values here is done at once (a driver batches 256)
DELETE_NOW_MAX = 1024


def is_local(graph: Graph) -> bool:
    """The graph's ops neither wait on a peer nor reach outside this process."""
    return graph.opcodes <= INLINE_OPCODES and not any(isinstance(f, KernelRef) for f in graph.fns)


class WorkerState:
    """One rank's decisions: ``handle(event, now) -> list[Action]``. Not thread-safe: the
    shells call it under one lock; only :meth:`begin_inline` is called without it (the
    I/O thread's, which its docstring says why it may be)."""

    def __init__(
        self,
        hello: WorkerHello,
        *,
        now: float,
        heartbeat_s: float = HEARTBEAT_S,
        liveness: int = HEARTBEAT_LIVENESS,
        inline_s: float = INLINE_RUN_S,
    ) -> None:
        self.hello = hello
        self.rank = hello.rank
        self.heartbeat_s = heartbeat_s
        self.bad_heartbeats = 0  # Welcomes whose interval was refused (kept our own)
        # the broker's --max-message, as its last Welcome said (the daemon bounds it)
        self.broker_max_message = MAX_MESSAGE
        self.liveness = liveness
        self.inline_s = inline_s  # 0 sends every job to the pool
        # joining
        self.joined = False
        self.broker_id = ""
        self.cluster: dict[str, Any] = {}
        self.world_size = 0
        self.last_heard = now
        self.next_hello = now
        self.hello_wait = _HELLO_FIRST
        self.joining_since = now  # this attempt to join began (Unanswered after UNANSWERED_S)
        self.told_unanswered = False
        self.next_beat = now
        self.directory: dict[int, PeerInfo] = {}
        # programs
        self.programs: SizedLRU[str, Program] = SizedLRU(PROGRAM_SLOTS, WORKER_PROGRAM_BYTES)
        # the program begin_inline found last (digest, graph), the count of programs' puts
        # and gets then and its jobs' entry in jobs: while no other was made, it is still the
        # newest there (a get would only make it the newest again), so its next job looks
        # no further
        self._newest: tuple[str, Graph | None, int, tuple[str, bool, bool]] = _NO_PROGRAM
        self._program_moves = 0  # puts and gets of programs but begin_inline's own
        self.broken: LRU[str, str] = LRU(PROGRAM_SLOTS)  # programs that did not load here, why
        self.refused_code: LRU[str, str] = LRU(256)  # programs the code policy refused, why
        self.refused_programs = 0  # programs whose digest did not match their graph
        # jobs and sessions
        self.jobs: dict[JobKey, tuple[str, bool, bool]] = {}  # handed out: digest, local, pooled
        self.queued: dict[str, int] = {}  # tasks on the pool per session, running or waiting
        self.aborted: LRU[JobKey, str] = LRU(_MEMORY)  # why each stopped job stopped
        self.closed: LRU[str, str] = LRU(_MEMORY)  # closed sessions, why
        self.quick: LRU[str, bool] = LRU(_MEMORY)  # program digest -> its last run was quick
        self.local: LRU[str, bool] = LRU(PROGRAM_SLOTS)  # program digest -> is_local(graph)
        # program digest -> the moves its runs here take (move_keys.moves_in)
        self.takes: LRU[str, frozenset[MoveSlot]] = LRU(PROGRAM_SLOTS)
        self.spu_jobs: LRU[JobKey, bool] = LRU(_MEMORY)
        self.spu_counted: LRU[JobKey, bool] = LRU(_MEMORY)
        self.spu_failures: dict[str, int] = {}
        # bumped after every entry made in closed, aborted or refused_code (by any thread),
        # and read by begin_inline before it looks at them: while it stays, what
        # begin_inline last found of a session and program (neither closed nor refused)
        # still holds, and no job begun since was stopped (an entry made after a job's look
        # moves it before the check after its run, which then looks again)
        self.stops = 0
        # (session, digest, stops) as begin_inline last found them clear
        self.clean: tuple[str, str, int] = ("", "", -1)
        self.done = 0
        self.failed = 0
        self.inline = 0  # jobs run without a hand-off to the pool

    # -- queries (for the shells' threads, under the shells' lock) --------------------------
    def stopped(self, job: JobKey) -> str | None:
        """Why a job must stop (aborted, or its session closed), or None."""
        reason = self.aborted.get(job)
        if reason is None and job[0] in self.closed:
            reason = f"job {job[1]} aborted: session closed: {self.closed[job[0]]}"
        return reason

    def program(self, digest: str) -> Program | None:
        self._program_moves += 1
        return self.programs.get(digest)

    # -- the one entry point ------------------------------------------------------------
    def handle(self, event: Any, now: float) -> list[Action]:
        if isinstance(event, Tick):
            return self._tick(now)
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            actions: list[Action] = handler(self, event, now)
            return actions
        if isinstance(event, Record):  # any word from the broker shows it is alive
            self.last_heard = now
        return []

    # -- joining ------------------------------------------------------------------------
    def _tick(self, now: float) -> list[Action]:
        if not self.joined:
            if now < self.next_hello:
                return []
            self.next_hello = now + self.hello_wait
            self.hello_wait = min(self.hello_wait * 2, _HELLO_MAX)
            waited = now - self.joining_since
            if waited >= UNANSWERED_S and not self.told_unanswered:
                self.told_unanswered = True
                return [Unanswered(waited), Send(self.hello)]
            return [Send(self.hello)]
        silent = now - self.last_heard
        if silent > self.heartbeat_s * self.liveness:
            self._rejoin(now)  # resets last_heard: the silence is measured before
            return [Reconnect(f"no word from the broker for {silent:.1f} s")]
        if now >= self.next_beat:
            self.next_beat = now + self.heartbeat_s
            return [Beat()]
        return []

    def next_due(self) -> float:
        """When the timers next have something to do (the I/O loop may sleep until then):
        a hello, a heartbeat, or the moment the broker's silence becomes too long (so a
        worker that sleeps between heartbeats still gives up on a silent broker on time)."""
        if not self.joined:
            return self.next_hello
        return min(self.next_beat, self.last_heard + self.heartbeat_s * self.liveness)

    def _welcome(self, msg: Welcome, now: float) -> list[Action]:
        self.last_heard = now
        self.joined = True
        if heartbeat_ok(msg.heartbeat_s):  # else the worker's own stays (limits.py)
            self.heartbeat_s = msg.heartbeat_s
        else:
            self.bad_heartbeats += 1
        self.cluster, self.world_size = msg.cluster, msg.world_size
        self.broker_max_message = msg.max_message
        self.next_beat = now  # report counters at once, then every heartbeat_s
        new = msg.broker_id != self.broker_id
        self.broker_id = msg.broker_id
        actions: list[Action] = [CloseAll("the broker restarted")] if new else []
        return [*actions, Joined(msg.broker_id, new)]

    def _refused(self, msg: Refused, now: float) -> list[Action]:
        self.last_heard = now
        if not self.joined and msg.error.kind in ("RegistrationError", "AuthenticationError"):
            return [Stop(msg.error)]
        return []

    def _reregister(self, msg: Reregister, now: float) -> list[Action]:
        self._rejoin(now)
        return self._tick(now)

    def _bye(self, msg: Bye, now: float) -> list[Action]:
        self._rejoin(now)
        self.next_hello = now + _HELLO_FIRST
        return []

    def _directory(self, msg: Directory, now: float) -> list[Action]:
        self.last_heard = now
        self.directory = msg.peers
        return []

    def _rejoin(self, now: float) -> None:
        self.joined = False
        self.next_hello = now
        self.hello_wait = _HELLO_FIRST
        self.last_heard = now
        self.joining_since = now
        self.told_unanswered = False

    # -- programs -----------------------------------------------------------------------
    def _program(self, msg: Program, now: float) -> list[Action]:
        self.last_heard = now
        if msg.graph is None:  # still sealed: nothing to run (the daemon opens it first)
            self.refused_programs += 1
            return []
        if msg.graph.digest != msg.digest:
            self.refused_programs += 1
            # a digest past the bound names no program: nothing kept under it
            if (
                msg.digest not in self.programs and len(msg.digest) <= MAX_DIGEST_CHARS
            ):  # a genuine copy stays usable
                self.broken[msg.digest] = (
                    f"ProtocolError: the program sent as {msg.digest} has digest "
                    f"{msg.graph.digest}; refused"
                )
            return []
        self._program_moves += 1
        self.programs.put(msg.digest, msg, program_nbytes(msg))
        self.broken.pop(msg.digest, None)
        return []

    def _unloadable(self, event: ProgramUnloadable, now: float) -> list[Action]:
        self.broken[event.digest] = event.why
        return []

    def _code_refused(self, event: CodeRefused, now: float) -> list[Action]:
        self.refused_code[event.digest] = event.why
        self.stops += 1  # after the entry (see __init__)
        return []

    # -- jobs ---------------------------------------------------------------------------
    def _exec(self, msg: Exec, now: float) -> list[Action]:
        self.last_heard = now
        sid, job = msg.session, msg.job
        refusal = self.refused_code.get(msg.digest)
        if refusal is not None:
            info = ErrorInfo(
                "RemoteError", refusal, rank=self.rank, op="program",
                remote_type="PermissionError", job=job,
            )  # fmt: skip
            return [Send(Failed(sid, job, self.rank, info))]
        self._program_moves += 1
        program = self.programs.get(msg.digest)
        graph = program.graph if program is not None else None
        if graph is None:
            broken = self.broken.get(msg.digest)
            why = (
                f"cannot load the program here: {broken}"
                if broken
                else f"program {msg.digest} is not cached here (or not opened)"
            )
            error = ErrorInfo("ProtocolError", why, rank=self.rank, op="program", job=job)
            return [Post(Failed(sid, job, self.rank, error))]
        if sid in self.closed:
            return []  # the session ended before its job arrived: nothing to run or say
        if "spu.run" in graph.opcodes:
            self.spu_jobs[(sid, job)] = True
        inline = bool(self.quick.get(msg.digest)) and not self.queued.get(sid)
        local = self.local.get(msg.digest)
        if local is None:  # a digest names one graph (checked when it was cached)
            local = self.local[msg.digest] = is_local(graph)
        self.jobs[(sid, job)] = (msg.digest, local, not inline)
        if inline:
            self.inline += 1
        else:  # the pool's task for it ends with the run's report (no TaskDone)
            self.queued[sid] = self.queued.get(sid, 0) + 1
        run = Run(msg, graph, inline=inline)
        if local:
            return [run]  # a local job gets no moves
        takes = self.takes.get(msg.digest)
        if takes is None:  # cached as local is
            takes = self.takes[msg.digest] = moves_in(graph, self.rank)
        return [Expect((sid, job), takes), run]

    # -- the hot path: a repeat quick job, without events or actions ---------------------
    def begin_inline(self, msg: Exec, now: float, job: str | None = None) -> Graph | None:
        """``handle(msg)`` for a job with nothing to decide but "run it inline now": its
        program is cached here and not refused, its last run here was quick (so it is
        local: no ``Expect``), its session is open with nothing queued, and the job is
        neither known nor aborted. Makes the bookkeeping :meth:`_exec` makes for such a
        job and returns the graph to run; None, with nothing changed, for any other job
        (then ``handle(msg)`` decides). ``job``: the job is ``msg`` but for this id (a
        program's next job, as the job shell reads it: ``Jobs.run_now``).

        Called by the I/O thread without the lock (a lock round per job less): it writes
        only what no other thread writes (the program cache's order and the program it
        found last, ``last_heard``, the ``inline`` count, a new key of ``jobs``), and it
        reads the rest by single lookups, each atomic. A program's next job takes the graph
        it found last while no program was put or looked up since (``_program_moves``): the
        program is still the newest in the cache, where a lookup would leave it. The other
        threads (job threads, the peer thread) only end jobs, drop queued counts, make
        programs slow and abort jobs: read a moment early, each of these leaves the job to
        ``handle`` or to the check after its run, as it would a moment later."""
        sid, digest = msg.session, msg.digest
        key = (sid, msg.job if job is None else job)
        stops = self.stops  # first: an entry made after this moves it (stopped_inline)
        if (
            not self.quick.get(digest)
            or self.queued.get(sid)
            or (self.aborted and key in self.aborted)
            or key in self.jobs
        ):
            return None
        # closed and refused_code (LRUs: each lookup a Python-level slot call) are looked at
        # again only once an entry was made in them since they were last found clear
        clean = self.clean
        if not (clean[2] == stops and clean[0] == sid and clean[1] == digest):
            if sid in self.closed or digest in self.refused_code:
                return None
            self.clean = (sid, digest, stops)
        newest = self._newest
        if newest[0] is not digest or newest[2] != self._program_moves:  # (most: is)
            program = self.programs.get(digest)
            graph = program.graph if program is not None else None
            if graph is None:
                return None
            newest = self._newest = (digest, graph, self._program_moves, (digest, True, False))
        self.last_heard = now
        self.jobs[key] = newest[3]  # (digest, local, pooled): one tuple per program
        graph = newest[1]
        self.inline += 1
        return graph

    def stopped_inline(self, sid: str, job: str) -> bool:
        """Whether a job :meth:`begin_inline` began was stopped (aborted, or its session
        closed) since: nothing was, while no entry was made in those tables (each lookup
        atomic, read without the lock as ``begin_inline`` reads them)."""
        if self.clean[2] == self.stops:
            return False
        return (sid, job) in self.aborted or sid in self.closed

    def end_inline(self, sid: str, job: str, seconds: float) -> None:
        """``handle(RunFinished)`` for a job :meth:`begin_inline` began, whose ``Done`` was
        posted (the job shell found it neither aborted nor its session closed once it had
        run: ``Jobs.run_now``): the same bookkeeping. A stop that came after that answer
        only forgets its reason here, as for any job that ended (its outputs were freed by
        the stop). Written out in ``Jobs.run_repeat``'s common case (a call per job less):
        keep the two alike (``tests/test_fused_repeat.py`` compares their books)."""
        self.done += 1
        # _ended for a job begun inline (local, not pooled), written out: a call less
        key = (sid, job)
        digest = self.jobs.pop(key, ("",))[0]
        if digest:
            quick = seconds <= self.inline_s
            if self.quick.get(digest) is quick:
                self.quick.move_to_end(digest)
            else:
                self.quick[digest] = quick
        if self.aborted:  # (most often empty: no call; its entries are made under the lock)
            self.aborted.pop(key, None)

    def _ended(self, sid: str, job: str, seconds: float) -> list[Action]:
        """Bookkeeping common to every end of a run; the job's stop reason is forgotten."""
        digest, local, pooled = self.jobs.pop((sid, job), ("", False, False))
        if digest:
            quick = seconds <= self.inline_s and local
            if self.quick.get(digest) is quick:  # the common case: only made the newest
                self.quick.move_to_end(digest)
            else:
                self.quick[digest] = quick
        if pooled:  # before its answer goes out: the session's next job may run inline
            self._task_done(TaskDone(sid), 0.0)
        self.aborted.pop((sid, job), None)
        return [] if local else [EndJob((sid, job))]

    def _finished(self, event: RunFinished, now: float) -> list[Action]:
        key = (event.session, event.job)
        if self.stopped(key) is not None:  # stopped while its outputs were being stored
            actions = self._ended(*key, event.seconds)
            return [*actions, FreeJob(key), *self._spu_failed(key)]
        self.done += 1
        return [*self._ended(*key, event.seconds), Post(event.reply)]

    def _run_failed(self, event: RunFailed, now: float) -> list[Action]:
        key = (event.session, event.job)
        self.failed += 1
        actions = self._ended(*key, event.seconds)
        failed = Failed(event.session, event.job, self.rank, event.error)
        return [*actions, *self._spu_failed(key), Post(failed)]

    def _run_aborted(self, event: RunAborted, now: float) -> list[Action]:
        key = (event.session, event.job)
        return [*self._ended(*key, event.seconds), FreeJob(key), *self._spu_failed(key)]

    def _abort(self, msg: Abort, now: float) -> list[Action]:
        self.last_heard = now
        key = (msg.session, msg.job)
        reason = f"job {msg.job} aborted: {msg.error.message}"
        self.aborted[key] = reason  # also before its Exec: then its run stops at once
        self.stops += 1  # after the entry: begin_inline reads it before its look
        return [StopWaits(key, reason), FreeJob(key), *self._spu_failed(key)]

    def _move_refused(self, event: MoveRefused, now: float) -> list[Action]:
        failed = Post(Failed(event.session, event.job, self.rank, event.error))
        return [failed, *self._abort(Abort(event.session, event.job, event.error), now)]

    def _exec_unloadable(self, event: ExecUnloadable, now: float) -> list[Action]:
        return [Send(Failed(event.session, event.job, self.rank, event.error))]

    def _spu_failed(self, key: JobKey) -> list[Action]:
        """Count a failed or aborted job that has SPU ops (once), and drop the lanes."""
        if key not in self.spu_jobs or key in self.spu_counted:
            return []
        self.spu_counted[key] = True
        self.spu_failures[key[0]] = self.spu_failures.get(key[0], 0) + 1
        return [DropLanes(key[0])]

    # -- data and names: session tasks in arrival order ------------------------------------
    def _fetch(self, event: FetchArrived, now: float) -> list[Action]:
        self.last_heard = now
        if event.stored:  # answer at once, even during a long job
            return [ReplyNow(event.msg)]
        return self._submit(event.msg.session, event.msg)

    def _task(self, msg: Delete | SaveSymbol | DeleteSymbol, now: float) -> list[Action]:
        self.last_heard = now
        return self._submit(msg.session, msg)

    def _delete(self, msg: Delete, now: float) -> list[Action]:
        """A delete (the driver's batch of values it let go) frees them at once when
        nothing of its session is queued or running: a pool task would cost two thread
        hand-offs and keep the session's next jobs off the inline path until it ran."""
        self.last_heard = now
        if self.queued.get(msg.session) or len(msg.uris.get(self.rank, ())) > DELETE_NOW_MAX:
            return self._submit(msg.session, msg)
        return [DeleteNow(msg)]

    def _submit(self, sid: str, msg: Record) -> list[Action]:
        self.queued[sid] = self.queued.get(sid, 0) + 1
        return [Submit(sid, msg)]

    def _task_done(self, event: TaskDone, now: float) -> list[Action]:
        left = self.queued.get(event.session, 0) - 1
        if left > 0:
            self.queued[event.session] = left
        else:
            self.queued.pop(event.session, None)
        return []

    # -- sessions -----------------------------------------------------------------------
    def _session_closed(self, msg: SessionClosed, now: float) -> list[Action]:
        self.last_heard = now
        sid, reason = msg.session, msg.reason
        self.closed[sid] = reason
        actions: list[Action] = []
        for key in [k for k in self.jobs if k[0] == sid]:
            why = f"job {key[1]} aborted: {reason}"
            self.aborted[key] = why
            actions.append(StopWaits(key, why))
        self.stops += 1  # once, after the entries (see __init__)
        self.spu_failures.pop(sid, None)
        actions.append(CloseSession(sid, reason))
        if self.queued.get(sid):  # whatever is still queued may recreate values: free again
            actions += self._submit(sid, msg)
        return actions

    # -- status -------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {
            "jobs_done": self.done,
            "jobs_failed": self.failed,
            "jobs_inline": self.inline,
            "jobs_known": len(self.jobs),
        }


_HANDLERS: dict[type, Any] = {
    Welcome: WorkerState._welcome,
    Refused: WorkerState._refused,
    Reregister: WorkerState._reregister,
    Bye: WorkerState._bye,
    Directory: WorkerState._directory,
    Program: WorkerState._program,
    ProgramUnloadable: WorkerState._unloadable,
    CodeRefused: WorkerState._code_refused,
    Exec: WorkerState._exec,
    ExecUnloadable: WorkerState._exec_unloadable,
    RunFinished: WorkerState._finished,
    RunFailed: WorkerState._run_failed,
    RunAborted: WorkerState._run_aborted,
    Abort: WorkerState._abort,
    MoveRefused: WorkerState._move_refused,
    FetchArrived: WorkerState._fetch,
    Delete: WorkerState._delete,
    SaveSymbol: WorkerState._task,
    DeleteSymbol: WorkerState._task,
    TaskDone: WorkerState._task_done,
    SessionClosed: WorkerState._session_closed,
}
