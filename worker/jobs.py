"""The job shell: executes what the worker's state machine (``state.py``) decides.

Every event (a broker message from the I/O thread, a report from a job thread) goes
through :meth:`Jobs.handle`: the state decides under one lock, then the actions are
performed outside it. This shell runs jobs, wakes waits, frees values and drops SPU lanes;
control actions (sends, reconnects) go back to the ZeroMQ shell (``daemon.py``).

Jobs run on a bounded pool of job threads (``SessionPool``). Within a session, work runs in
arrival order (jobs, deletes, saves, late fetches), which is the order the broker
forwarded it in; so a job sees the outputs of the jobs before it and a delete never
overtakes the job that still reads the value. A delete of a session with nothing queued
(the driver's batch of values it let go, most deletes) is done at once on the I/O thread:
it overtakes nothing, and a pool task would keep the session's next jobs off the inline
path until it ran. Sessions do not wait for each other while
the pool has a free thread (``job_threads``, MAX_JOB_THREADS by default).

The pool is shared out by driver (``SessionPool.share``: no driver's jobs hold more than
three quarters of it), so jobs waiting for moves a party never sends, each holding its
thread until its deadline, leave the rest to other drivers' jobs (red team R33-5). In
secure mode a job's driver is the key that sealed it here (``JobSealers.hold``), never a
name the broker wrote. In plaintext no driver identity reaches a worker (a name there is
anyone's, and the broker passes none), so the share is keyed by the job's ranks, the
parties it may wait for: jobs waiting on a silent party hold at most the share, and jobs
with no part for that party keep the rest. A driver that varies its jobs' ranks gets
several shares; better than nothing where every name is anyone's, not a bound.
Deletes, saves and fetches (quick, waiting on no peer) share one owner.

Quick jobs skip the hand-off: handing a job to a pool thread and back costs two thread
wake-ups and a GIL switch, more than a trivial job's whole run on a busy 2-core machine. A
program runs inline, on the thread that received it, when (1) it is purely local (only the
opcodes in :data:`~mpl.worker.state.INLINE_OPCODES`: no moves to wait for, which the peer
thread delivers, no SPU, no installed kernels), (2) its last run on this worker
took at most ``inline_s`` (1 ms by default; its first run is always on the pool), and (3)
its session has nothing queued or running, so arrival order holds. A run that turns out
slower sends the program's next runs back to the pool. The state decides all three.

Such a program's runs repeat: its plan is compiled once (``inline_run.py``: each op the
call it makes), a plaintext job comes as a job id the I/O thread read by comparison with
the program's last ``Exec``, and its ``Done`` goes out as frames packed from its fields,
with no record made on the way (``inline_jobs.py``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mpl.wire.codec import check_safe
from mpl.wire.data import Delete, Fetch
from mpl.wire.done_pack import OneSpanDone
from mpl.wire.errors import (
    AuthenticationError,
    JobAbortedError,
    MessageTooLargeError,
    SessionError,
)
from mpl.wire.graph import Graph
from mpl.wire.jobs import Done, Exec, Lit
from mpl.wire.limits import MAX_JOB_THREADS, MAX_MESSAGE, check_symbol_name, job_timeout
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo, to_info
from mpl.wire.run_stats import pack_stats, run_seconds
from mpl.wire.sessions import Ack, DeleteSymbol, Reply, SaveSymbol, SessionClosed
from mpl.wire.sockets import least_encoded_bytes, too_large
from mpl.worker.inline_jobs import InlineJobs, done_record
from mpl.worker.inline_run import InlineRun
from mpl.worker.interpreter import ABSENT, OpFailed, Plan, run_graph
from mpl.worker.job_run import JobRun, JobSealers
from mpl.worker.keyed_mailbox import KeyedMailbox, MoveKey
from mpl.worker.outputs import SCALAR_NAMES, describe, is_small
from mpl.worker.peers import PeerLinks
from mpl.worker.session_pool import SessionPool
from mpl.worker.spu_link import SpuLinks
from mpl.worker.state import WorkerState
from mpl.worker.state_events import (
    Action,
    CloseSession,
    DeleteNow,
    DropLanes,
    EndJob,
    Expect,
    FreeJob,
    Post,
    ReplyNow,
    Run,
    RunAborted,
    RunFailed,
    RunFinished,
    Send,
    StopWaits,
    Submit,
    TaskDone,
)
from mpl.worker.store import ObjectStore, symbol_uri

__all__ = ["DEFAULT_JOB_TIMEOUT_S", "Jobs"]

log = logging.getLogger("mpl.worker")
DEFAULT_JOB_TIMEOUT_S = 600.0
RunEnd = RunFinished | RunFailed | RunAborted


class Jobs(InlineJobs):
    """Everything a worker does on behalf of sessions, as its state machine says."""

    def __init__(
        self,
        state: WorkerState,
        store: ObjectStore,
        mailbox: KeyedMailbox[MoveKey, tuple[str, str]],
        peers: PeerLinks,
        post: Callable[[Record], None],
        *,
        post_frames: Callable[[list[Any]], None] | None = None,
        post_frame: Callable[[bytes], None] | None = None,
        seal_scalars: Callable[[str, str, dict[int, Any]], dict[int, bytes] | None] | None = None,
        sealers: JobSealers | None = None,
        extensions: dict[str, Callable[[], Any]] | None = None,
        job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
        spu: SpuLinks | None = None,
        trusted: bool = False,
        job_threads: int = MAX_JOB_THREADS,
    ) -> None:
        self.state = state
        self.rank = state.rank
        self.trusted = trusted  # results to drivers may be pickles (a trusted cluster)
        # the largest frame an answer may have (the daemon's, once the broker said its own)
        self.send_limit = MAX_MESSAGE
        self.store = store
        self.mailbox = mailbox
        self.peers = peers
        self.post = post  # thread-safe: send a message to the broker
        # the I/O thread's sender of an inline Done's frames (None: Dones go to post)
        self.post_frames = post_frames
        # plaintext: the I/O thread's sender of an inline Done's one frame (wire v4), packed
        # from a template (mpl.wire.done_pack.OneSpanDone), kept per program and session
        self.post_frame = post_frame
        self._one_span: tuple[str, InlineRun | None, OneSpanDone | None] = ("", None, None)
        # secure mode: seals an inline Done's values for post_frames (WorkerSeal.sealed_scalars)
        self.seal_scalars = seal_scalars
        # secure mode: the driver that sealed a job opened here (WorkerSeal.recipient), which
        # its moves carry and must carry to reach it; held for the jobs the pool holds; and
        # a fetch's Reply, its value sealed for the Fetch read here and answered (reply)
        self.sealers = sealers
        self.spu = spu
        self.job_timeout_s = job_timeout_s
        self._factories = dict(extensions or {})
        self._extensions: dict[str, Any] = {}
        self._pool = SessionPool(job_threads, f"mpl-job-{self.rank}")
        self._plans: dict[str, Plan] = {}  # by program digest (a digest names one graph)
        self._compiled: dict[str, InlineRun | None] = {}  # the same, compiled (None: not)
        # the inline run going on (on the I/O thread), for its progress reports
        self._inline: tuple[str, str, InlineRun, float, float] | None = None
        self._inline_ctx: JobRun | None = None
        self._reports = self._report_inline  # one bound method, not one per run
        # the last job's timeout_s, the cap then, and what the job was given
        self._last_timeout = (-1.0, job_timeout_s, 0.0)
        self._lock = threading.Lock()  # the state's, held only while it decides
        self._ext_lock = threading.Lock()
        self._runs: dict[tuple[str, str], JobRun] = {}  # running jobs, for progress reports

    @property
    def inline_s(self) -> float:
        """A program whose last run took at most this may run inline (0: never)."""
        return self.state.inline_s

    @inline_s.setter
    def inline_s(self, seconds: float) -> None:
        with self._lock:
            self.state.inline_s = seconds

    # -- the state machine ----------------------------------------------------------------
    def handle(self, event: Any) -> list[Action]:
        """Let the state decide on ``event``; perform the job actions here and return the
        rest (sends, reconnects, joins) for the I/O shell."""
        with self._lock:
            actions = self.state.handle(event, time.monotonic())
        return self.perform(actions)

    def _report_inline(self, done: int, index: int, now: float) -> float:
        """A compiled inline run's progress report, due at an op's start: made by a job
        context as a pooled run's is (made for the run's first report); returns when the
        next is due."""
        assert self._inline is not None  # set by _run_steps before the run
        sid, job, compiled, t0, timeout = self._inline
        run = self._inline_ctx
        if run is None or run.job is not job or run.started != t0:
            run = self._inline_ctx = JobRun(self, sid, job, t0 + timeout, t0, compiled.plan.graph)
        plan = compiled.plan
        run.position = (done, plan.ops_here, plan.graph, index)
        run.report(now)
        return run.next_report

    def report(self, event: Any) -> None:
        """From a job thread: what came of a run or task. Its answers go on the result
        channel (a job thread never touches the I/O thread's socket)."""
        for action in self.handle(event):
            if isinstance(action, Send):
                self.post(action.msg)
            else:  # nothing else follows from a thread's report; say so if it ever does
                log.error("rank %d: %s after %s left undone", self.rank, action, event)

    def stopped(self, job: tuple[str, str]) -> str | None:
        """Why a job must stop (aborted, or its session closed), or None: asked by the job's
        waits on peers' queues and SPU messages."""
        with self._lock:
            return self.state.stopped(job)

    def spu_failures(self, sid: str) -> int:
        with self._lock:
            return self.state.spu_failures.get(sid, 0)

    def perform(self, actions: list[Action]) -> list[Action]:
        rest: list[Action] = []
        for action in actions:
            if isinstance(action, Run):
                msg, graph = action.msg, action.graph
                if action.inline:
                    self.report(self._timed_run(msg, graph))
                else:
                    # its share of the pool is its driver's (secure: the key that sealed it,
                    # kept until _pooled is done); plaintext: its ranks (see the docstring)
                    owner: object = msg.ranks
                    if self.sealers is not None:
                        owner = self.sealers.hold(msg.session, msg.job)
                    run = functools.partial(self._pooled, msg, graph)
                    self._pool.submit(msg.session, run, owner)
            elif isinstance(action, Post):
                self.post(action.msg)
            elif isinstance(action, Expect):
                self.mailbox.open(action.job, action.takes)
            elif isinstance(action, EndJob):
                self.mailbox.end(action.job)
            elif isinstance(action, StopWaits):
                self.mailbox.close(action.job, action.reason)
                if self.spu is not None:
                    self.spu.wake()
            elif isinstance(action, FreeJob):
                self.store.drop_job(*action.job)
            elif isinstance(action, DropLanes):
                self._drop_lanes(action.session)
            elif isinstance(action, Submit):
                sid, task = action.session, action.msg
                self._pool.submit(sid, functools.partial(self._task, sid, task))
            elif isinstance(action, DeleteNow):
                freed = action.msg
                self.store.delete(freed.session, freed.uris.get(self.rank, []))
            elif isinstance(action, ReplyNow):
                rest.append(Send(self._fetch_reply(action.msg)))
            elif isinstance(action, CloseSession):
                self._close(action.session, action.reason)
            else:
                rest.append(action)
        return rest

    # -- runs -----------------------------------------------------------------------------
    def _pooled(self, msg: Exec, graph: Graph) -> None:
        try:
            self.report(self._timed_run(msg, graph))  # its report also ends the pool's task
        finally:  # its answer was sealed and posted by the report: its sealer let go
            if self.sealers is not None:
                self.sealers.release(msg.session, msg.job)

    def _plan(self, digest: str, graph: Graph) -> Plan:
        """The plan of ``graph`` (program ``digest``) for this rank, built once."""
        plan = self._plans.get(digest)
        if plan is None:
            if len(self._plans) > 512:
                self._plans.clear()
            plan = self._plans[digest] = Plan.build(graph, self.rank)
        return plan

    def _timed_run(self, msg: Exec, graph: Graph) -> RunEnd:
        """Run the job and say how it ended (outputs stored when it finished), whatever
        happened: the thread that runs it must report it."""
        end = self._run(msg, graph)
        if isinstance(end, Done):
            return RunFinished(end.session, end.job, run_seconds(end.stats), end)
        return end

    def _run(
        self, msg: Exec, graph: Graph, *, tracked: bool = True
    ) -> Done | RunFailed | RunAborted:
        """:meth:`_timed_run`, saying a finished run by its ``Done`` alone (its ``run_s``
        is the run's seconds): a record less per job on the inline path.

        ``tracked`` lists it among the running jobs whose progress the I/O thread reports
        (and counts in ``jobs_running``): pointless for a run on the I/O thread itself,
        which reports at each op boundary all the same."""
        # one clock (monotonic) for the run's seconds, its stats and its spans: a clock
        # call less per job each, and spans start from the run's own start
        t0 = time.monotonic()
        try:
            sid, job = msg.session, msg.job
            # An untracked run is an inline one that the state began a moment ago on this
            # very thread, under its lock, refusing a stopped job: no second look (a stop
            # that came since is the state's to see when the run ends, as for any run).
            if tracked and self.stopped((sid, job)):
                return RunAborted(sid, job, 0.0)
            started, wall = t0, time.time()
            timeout = self._timeout(msg, job)
            if isinstance(timeout, RunFailed):
                return timeout
            run = JobRun(self, sid, job, started + timeout, started, graph)
            if tracked:
                self._runs[(sid, job)] = run
            try:
                mine = msg.bindings.get(self.rank)
                inputs: list[Any] | tuple[()] = ()  # none bound here (most jobs): none held
                if mine:
                    inputs = [self._resolve(sid, b) for b in mine]
                    if len(inputs) != len(graph.inputs):
                        raise SessionError(
                            f"job binds {len(inputs)} inputs on rank {self.rank}, "
                            f"the graph has {len(graph.inputs)}"
                        )
                plan = self._plans.get(msg.digest) or self._plan(msg.digest, graph)
                outputs = run_graph(plan, inputs, run)
            except JobAbortedError:
                return RunAborted(sid, job, time.monotonic() - t0)
            except OpFailed as exc:
                return self._op_failed(sid, job, exc, t0)
            except BaseException as exc:  # user code may raise SystemExit: still a failed job
                info = to_info(exc, rank=self.rank, op="inputs", job=job)
                return RunFailed(sid, job, time.monotonic() - t0, info)
            finally:
                if tracked:
                    self._runs.pop((sid, job), None)
            # An abort that came during the run is the state's to see (RunFinished of a stopped
            # job frees its outputs and says nothing), so no second look under the lock here.
            values, metas = self._store_outputs(sid, job, msg.inline, outputs)
            stats = pack_stats(time.monotonic() - t0, wall, run.spans)  # one blob, unread
            return done_record(sid, job, self.rank, values, stats, metas, run.saved)
        except BaseException as exc:  # the thread must report whatever happened
            error = to_info(exc, rank=self.rank, op="run", job=msg.job)
            return RunFailed(msg.session, msg.job, time.monotonic() - t0, error)

    def _timeout(self, msg: Exec, job: str) -> float | RunFailed:
        """The seconds job ``job`` (``msg``, or a repeat of it by that id) waits for peers,
        capped by this worker's ``--job-timeout`` (the jobs of a program ask for the same:
        worked out once), or why it has none."""
        asked, cap, timeout = self._last_timeout
        if msg.timeout_s != asked or cap != self.job_timeout_s:  # (NaN never equals)
            try:
                timeout = job_timeout(msg.timeout_s, self.job_timeout_s)
            except ValueError as exc:
                error = ErrorInfo("ProtocolError", str(exc), rank=self.rank, op="timeout", job=job)
                return RunFailed(msg.session, job, 0.0, error)
            # one tuple, so that threads read it whole
            self._last_timeout = (msg.timeout_s, self.job_timeout_s, timeout)
        return timeout

    def _op_failed(self, sid: str, job: str, exc: OpFailed, t0: float) -> RunFailed:
        # an answer or move too large to send is the runtime's refusal, not the op's code
        # raising: it reaches the driver as itself, saying what to do
        remote = type(exc.cause) is not MessageTooLargeError
        info = to_info(exc.cause, rank=self.rank, op=exc.label, job=job, remote=remote)
        log.info(
            "job %s failed at op %s: %s",
            job,
            exc.label,
            info.message[:200],
            extra={"session": sid, "job": job, "error": info.message[:200]},
        )
        return RunFailed(sid, job, time.monotonic() - t0, info)

    def _store_outputs(
        self, sid: str, job: str, inline: tuple[int, ...], outputs: list[Any]
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Store a finished run's outputs (the list itself, under its job id: no entry per
        output); the small ones the driver asked for inline (the indices in ``inline``),
        and the description of each (Done's ``values`` and ``metas``)."""
        values: dict[int, Any] = {}
        metas: dict[int, str] = {}
        for i, value in enumerate(outputs):
            if value is ABSENT:
                continue
            scalar = SCALAR_NAMES.get(type(value))
            if scalar is not None:  # most outputs: described by name and small, no calls
                metas[i] = scalar
                if i in inline:
                    values[i] = value
                continue
            metas[i] = describe(value)
            if i in inline and is_small(value):
                values[i] = value
        if metas:  # a value held here
            self.store.put_outputs(sid, job, outputs)
        return values, metas

    def _resolve(self, sid: str, binding: Any) -> Any:
        if binding is None:
            return ABSENT
        if isinstance(binding, Lit):
            return binding.value
        if isinstance(binding, str):
            return self.store.get(sid, binding)
        raise SessionError(f"bad input binding {binding!r}")

    def extension(self, name: str) -> Any:
        with self._ext_lock:
            ext = self._extensions.get(name)
            if ext is None:
                factory = self._factories.get(name)
                if factory is None:
                    raise RuntimeError(f"this worker has no {name!r} support")
                ext = self._extensions[name] = factory()
            return ext

    # -- session tasks: data and names ----------------------------------------------------
    def _task(self, sid: str, msg: Record) -> None:
        try:
            if isinstance(msg, Fetch):
                self.post(self._fetch_reply(msg))
            elif isinstance(msg, Delete):
                self.store.delete(sid, msg.uris.get(self.rank, []))
            elif isinstance(msg, SaveSymbol):
                self._save(msg)
            elif isinstance(msg, DeleteSymbol):
                self._unsave(msg)
            elif isinstance(msg, SessionClosed):  # after the tasks queued before the close
                self.store.close(sid)
        finally:
            self.report(TaskDone(sid))

    def _fetch_reply(self, msg: Fetch) -> Reply:
        try:
            value = self.store.get(msg.session, msg.uri)
            least, limit = least_encoded_bytes(value), self.send_limit
            if least > limit:  # refused before it is walked or encoded, which takes long
                what = f"the value {msg.uri} on rank {self.rank}"
                raise too_large(what, least, limit, "the broker", at_least=True)
            if not self.trusted:  # refuse here, with a reason, rather than fail to encode
                check_safe(value, f"to the driver (fetch of {msg.uri} from rank {self.rank})")
        except Exception as exc:
            return Reply(
                msg.req, error=to_info(exc, rank=self.rank, op="fetch", with_traceback=False)
            )
        if self.sealers is not None:
            return self.sealers.reply(msg, value)
        return Reply(msg.req, value=value)

    def _save(self, msg: SaveSymbol) -> None:
        try:
            if self.sealers is not None:  # secure: saves come in a driver's sealed job
                raise AuthenticationError(
                    "a SaveSymbol is the broker's word, not a driver's: a secure worker saves "
                    "a value only by a driver's sealed job (mp.save runs one)"
                )
            value = self.store.get(msg.session, msg.uri)
            if msg.info.persist:
                if self.store.disk is None:
                    raise SessionError("this worker has no data root to persist values in")
                self.store.disk.save(msg.info, value)
            else:
                self.store.put(msg.session, symbol_uri(msg.info.name), value)
            self.post(Ack(msg.req, self.rank))
        except Exception as exc:
            self.post(Ack(msg.req, self.rank, to_info(exc, rank=self.rank, op="save")))

    def _unsave(self, msg: DeleteSymbol) -> None:
        try:
            check_symbol_name(msg.name)  # whoever relays it, no file outside the data root
            self.store.delete(msg.session, [symbol_uri(msg.name)])
            if msg.persist and self.store.disk is not None:
                # secure: the broker's word deletes no file (its owner's sealed job does,
                # then this only settles the broker's table); plaintext: no rule
                by = "" if self.sealers is not None else None
                self.store.disk.delete(msg.name, by)
            self.post(Ack(msg.req, self.rank))
        except Exception as exc:  # a bad name, a disk error: the driver hears of it
            self.post(Ack(msg.req, self.rank, to_info(exc, rank=self.rank, op="delete")))

    # -- sessions -------------------------------------------------------------------------
    def _drop_lanes(self, sid: str) -> None:
        with self._ext_lock:
            service = self._extensions.get("spu")
        if service is not None:
            service.drop_lanes(sid)

    def _close(self, sid: str, reason: str) -> None:
        why = f"session {sid} closed: {reason}"
        self.mailbox.close_where(lambda job: job[0] == sid, why)
        if self.spu is not None:
            self.spu.mailbox.close_where(lambda lane: lane.startswith(f"{sid}/"), why)
        self._drop_lanes(sid)
        self.store.close(sid)

    def close_all(self, reason: str) -> None:
        """Close every session this worker holds values of or has work queued for."""
        for sid in dict.fromkeys(self.store.session_ids() + self._pool.sessions()):
            self.handle(SessionClosed(sid, reason))

    def report_progress(self) -> None:
        """From the I/O thread: report running jobs whose op runs long (no op boundary
        came to report it)."""
        if not self._runs:
            return
        now = time.monotonic()
        for run in list(self._runs.values()):
            run.report(now)

    def stats(self) -> dict[str, int]:
        extra: dict[str, int] = {}
        for ext in list(self._extensions.values()):
            extra.update(getattr(ext, "stats", dict)())
        return {
            **extra,
            **self.store.stats(),
            **self.state.stats(),
            "objects": self.store.count(),
            "sessions": len(self.store.session_ids()),
            "jobs_running": len(self._runs),
            "job_threads": self._pool.threads,
            "moves_pending": self.mailbox.pending()[0],
            "moves_duplicate": self.mailbox.duplicates,
            "moves_late": self.mailbox.late,
            "moves_held": self.mailbox.held(),
            "moves_dropped": self.mailbox.held_dropped + self.mailbox.overflow,
            "bytes_out": self.peers.bytes_out,
        }
