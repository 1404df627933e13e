"""Running jobs off the I/O thread, on a bounded pool of job threads (``SessionPool``).

Within a session, work runs in arrival order (jobs, deletes, saves, late fetches), which is
the order the broker forwarded it in; so a job sees the outputs of the jobs before it and
a delete never overtakes the job that still reads the value. Sessions do not wait for each
other while the pool has a free thread (``job_threads``, MAX_JOB_THREADS by default).

Quick jobs skip the hand-off: handing a job to a pool thread and back costs two thread
wake-ups and a GIL switch, more than a trivial job's whole run on a busy 2-core machine. A
program runs inline, on the thread that received it, when (1) it is purely local (only the
opcodes in :data:`INLINE_OPCODES`: no moves to wait for, which the I/O thread itself
delivers, no SPU, no installed kernels), (2) its last run on this worker took at most
``inline_s`` (1 ms by default; its first run is always on the pool), and (3) its session
has nothing queued or running, so arrival order holds. A run that turns out slower sends
the program's next runs back to the pool.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mpl.wire.codec import check_safe
from mpl.wire.data import Delete, Fetch, Move
from mpl.wire.errors import JobAbortedError, SessionError, UnsafeValueError
from mpl.wire.graph import Graph
from mpl.wire.jobs import Abort, Done, Exec, Failed, Lit, Program, output_uri
from mpl.wire.kernels import KernelRef
from mpl.wire.limits import MAX_JOB_THREADS, job_timeout
from mpl.wire.lru import LRU
from mpl.wire.progress import EVERY_S, FIRST_AFTER_S, Progress
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo, to_info
from mpl.wire.safe_values import unsafe
from mpl.wire.sessions import Ack, DeleteSymbol, Reply, SaveSymbol
from mpl.worker.interpreter import ABSENT, OpFailed, Plan, op_label, run_graph
from mpl.worker.keyed_mailbox import KeyedMailbox, MoveKey
from mpl.worker.peers import PeerLinks
from mpl.worker.session_pool import SessionPool
from mpl.worker.spu_link import SpuLinks
from mpl.worker.store import ObjectStore, symbol_uri
from mpl.worker.symbol_disk import check_name

__all__ = ["DEFAULT_JOB_TIMEOUT_S", "Jobs"]

log = logging.getLogger("mpl.worker")
DEFAULT_JOB_TIMEOUT_S = 600.0
INLINE_BYTES = 64 * 1024  # outputs up to this size ride back inside Done
INLINE_RUN_S = 0.001  # a program whose last run took at most this may run without hand-off
# Ops that neither wait on a peer nor reach outside the process (see the module docstring).
INLINE_OPCODES = frozenset({"pcall", "constant", "getitem", "converge"})
_CLOSED_MEMORY = 1024


def describe(value: Any) -> str:
    """A short description of a value for ``repr(Value)``: ``float64[3, 2]``, ``int``, ..."""
    np = sys.modules.get("numpy")  # no numpy loaded: no numpy values to describe
    if np is not None and isinstance(value, np.ndarray):
        return f"{value.dtype}[{', '.join(map(str, value.shape))}]"
    if np is not None and isinstance(value, np.generic):
        return str(value.dtype)
    describe_self = getattr(value, "mpl_describe", None)
    if callable(describe_self):
        return str(describe_self())
    return type(value).__name__


def is_small(value: Any, budget: int = INLINE_BYTES) -> bool:
    """Cheap bound on the encoded size: only plain data qualifies for inline return."""
    return _size(value, budget, 0) <= budget


def _size(value: Any, budget: int, depth: int) -> int:
    t = type(value)
    np = sys.modules.get("numpy")
    if (
        value is None
        or t in (bool, int, float)
        or (np is not None and isinstance(value, np.generic))
    ):
        return 16
    if t in (str, bytes):
        return len(value) + 8
    if np is not None and t is np.ndarray:
        return int(value.nbytes) + 64 if not value.dtype.hasobject else budget + 1
    if t in (list, tuple) and depth < 4 and len(value) <= 256:
        total = 8
        for item in value:
            total += _size(item, budget, depth + 1)
            if total > budget:
                break
        return total
    if t is dict and depth < 4 and len(value) <= 256:
        total = 8
        for k, v in value.items():
            total += _size(k, budget, depth + 1) + _size(v, budget, depth + 1)
            if total > budget:
                break
        return total
    return budget + 1


def _local(graph: Graph) -> bool:
    """The graph's ops neither wait on a peer nor reach outside this process."""
    return graph.opcodes <= INLINE_OPCODES and not any(isinstance(f, KernelRef) for f in graph.fns)


class _JobRun:
    """A job's view of the world (the interpreter's JobContext)."""

    def __init__(self, jobs: Jobs, session: str, job: str, deadline: float) -> None:
        self._jobs = jobs
        self.session = session
        self.job = job
        self.rank = jobs.rank
        self.deadline = deadline
        self.spans: list[list[Any]] = []
        self._next_report = time.monotonic() + FIRST_AFTER_S  # short jobs report nothing
        self._position: tuple[int, int, Graph, int] | None = None
        self._reported: tuple[int, int] | None = None

    def starting(self, done: int, total: int, graph: Graph, index: int) -> None:
        self._position = (done, total, graph, index)
        self.report(time.monotonic())

    def report(self, now: float) -> None:
        """Send where the job is if a report is due and says something new. Called at each
        op (job thread) and by the I/O thread, so a long op is reported too."""
        position = self._position
        if position is None or now < self._next_report:
            return
        done, total, graph, index = position
        if self._reported == (done, index):
            return
        self._next_report = now + EVERY_S
        self._reported = (done, index)
        label = op_label(graph, index)
        self._jobs.post(Progress(self.session, self.job, self.rank, done, total, label))

    def send(self, dst: int, op: int, seq: int, value: Any) -> None:
        move = Move(self.session, self.job, op, seq, self.rank, dst, value)
        try:
            self._jobs.peers.send(
                move, self.deadline, lambda: self._jobs.stopped((self.session, self.job))
            )
        except UnsafeValueError as exc:
            where = f"from rank {self.rank} to rank {dst} (a move for op {op} of job {self.job})"
            raise unsafe(exc.type_name or "value", where) from None

    def recv(self, src: int, op: int, seq: int) -> Any:
        key = (self.session, self.job, op, seq, src)
        late = (
            f"the move from rank {src} for op {op} did not arrive in time; the sender may be "
            "slow or dead, or the move was lost"
        )
        return self._jobs.mailbox.take(key, self.deadline, late, job=self.job)

    def extension(self, name: str) -> Any:
        return self._jobs.extension(name)


class Jobs:
    """Everything a worker does on behalf of sessions, behind the I/O thread."""

    def __init__(
        self,
        rank: int,
        store: ObjectStore,
        mailbox: KeyedMailbox[MoveKey, tuple[str, str]],
        peers: PeerLinks,
        post: Callable[[Record], None],
        *,
        extensions: dict[str, Callable[[], Any]] | None = None,
        job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
        spu: SpuLinks | None = None,
        trusted: bool = False,
        job_threads: int = MAX_JOB_THREADS,
        inline_s: float = INLINE_RUN_S,
    ) -> None:
        self.rank = rank
        self.inline_s = inline_s  # 0 sends every job to the pool
        self.trusted = trusted  # results to drivers may be pickles (a trusted cluster)
        self.store = store
        self.mailbox = mailbox
        self.peers = peers
        self.post = post  # thread-safe: send a message to the broker
        self.spu = spu
        self.job_timeout_s = job_timeout_s
        self._factories = dict(extensions or {})
        self._extensions: dict[str, Any] = {}
        self._pool = SessionPool(job_threads, f"mpl-job-{rank}")
        self._closed: LRU[str, str] = LRU(_CLOSED_MEMORY)
        self._aborted: LRU[tuple[str, str], str] = LRU(_CLOSED_MEMORY)  # job -> why
        self._plans: dict[tuple[str, int], Plan] = {}
        self._lock = threading.Lock()
        self._active: set[tuple[str, str]] = set()
        self._runs: dict[tuple[str, str], _JobRun] = {}  # running jobs, for progress reports
        # SPU lanes are dropped by every member at the same points: the failed SPU jobs.
        self._spu_jobs: LRU[tuple[str, str], bool] = LRU(_CLOSED_MEMORY)
        self._spu_counted: LRU[tuple[str, str], bool] = LRU(_CLOSED_MEMORY)
        self.spu_failures: dict[str, int] = {}
        # program digest -> its last run here was quick (see the module docstring)
        self._quick: LRU[str, bool] = LRU(_CLOSED_MEMORY)
        self.done = 0
        self.failed = 0
        self.inline = 0  # jobs run without a hand-off to the pool

    # -- scheduling -----------------------------------------------------------------------
    def _submit(self, sid: str, task: Callable[[], None]) -> None:
        self._pool.submit(sid, task)

    def _idle(self, sid: str) -> bool:
        """Nothing of session ``sid`` is queued or running on the pool."""
        return not self._pool.has_work(sid)

    def spu_job_failed(self, sid: str, job: str) -> None:
        """Count a failed or aborted job that has SPU ops (once), and drop the lanes."""
        with self._lock:
            key = (sid, job)
            if key not in self._spu_jobs or key in self._spu_counted:
                return
            self._spu_counted[key] = True
            self.spu_failures[sid] = self.spu_failures.get(sid, 0) + 1
            service = self._extensions.get("spu")
        if service is not None:
            service.drop_lanes(sid)

    def closed(self, sid: str) -> str | None:
        return self._closed.get(sid)

    def stopped(self, job: tuple[str, str]) -> str | None:
        """Why a job must stop (aborted, or its session closed), or None: asked by the job's
        waits on moves and SPU messages."""
        return self._aborted.get(job)

    def extension(self, name: str) -> Any:
        with self._lock:
            ext = self._extensions.get(name)
            if ext is None:
                factory = self._factories.get(name)
                if factory is None:
                    raise RuntimeError(f"this worker has no {name!r} support")
                ext = self._extensions[name] = factory()
            return ext

    # -- jobs -----------------------------------------------------------------------------
    def exec(self, msg: Exec, program: Program | None, broken: str | None = None) -> None:
        graph = program.graph if program is not None else None  # None: still sealed
        if graph is not None and "spu.run" in graph.opcodes:
            self._spu_jobs[(msg.session, msg.job)] = True
        if graph is None:
            why = (
                f"cannot load the program here: {broken}"
                if broken
                else (f"program {msg.digest} is not cached here (or not opened)")
            )
            error = ErrorInfo("ProtocolError", why, rank=self.rank, op="program", job=msg.job)
            self.post(Failed(msg.session, msg.job, self.rank, error))
            return
        self.mailbox.open((msg.session, msg.job))  # its moves are welcome from now on
        if self._quick.get(msg.digest) and self._idle(msg.session):
            self.inline += 1
            self._timed_run(msg, graph)
            return
        self._submit(msg.session, lambda: self._timed_run(msg, graph))

    def _timed_run(self, msg: Exec, graph: Graph) -> None:
        """Run the job, remember whether the program may run inline next time, and answer."""
        started = time.perf_counter()
        reply = self._run(msg, graph)
        quick = time.perf_counter() - started <= self.inline_s
        self._quick[msg.digest] = quick and _local(graph)
        if reply is not None:
            self.post(reply)

    def _plan(self, digest: str, graph: Graph) -> Plan:
        key = (digest, self.rank)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 512:
                self._plans.clear()
            plan = self._plans[key] = Plan.build(graph, self.rank)
        return plan

    def _run(self, msg: Exec, graph: Graph) -> Record | None:
        """Run the job; the answer to send (None: aborted, nothing to say)."""
        sid, job = msg.session, msg.job
        if self.closed(sid) or self.stopped((sid, job)):
            self._end(sid, job)
            self.spu_job_failed(sid, job)
            return None
        started, wall = time.monotonic(), time.time()
        try:  # capped by this worker's --job-timeout
            timeout = job_timeout(msg.timeout_s, self.job_timeout_s)
        except ValueError as exc:
            self.failed += 1
            self._end(sid, job)
            self.spu_job_failed(sid, job)
            error = ErrorInfo("ProtocolError", str(exc), rank=self.rank, op="timeout", job=job)
            return Failed(sid, job, self.rank, error)
        run = _JobRun(self, sid, job, started + timeout)
        self._active.add((sid, job))
        self._runs[(sid, job)] = run
        try:
            mine = msg.bindings.get(self.rank) or [None] * len(graph.inputs)
            inputs = [self._resolve(sid, b) for b in mine]
            if len(inputs) != len(graph.inputs):
                raise SessionError(
                    f"job binds {len(inputs)} inputs on rank {self.rank}, "
                    f"the graph has {len(graph.inputs)}"
                )
            outputs = run_graph(self._plan(msg.digest, graph), inputs, run)
        except JobAbortedError:
            self.store.drop_job(sid, job)
            self.spu_job_failed(sid, job)
            return None
        except OpFailed as exc:
            self.failed += 1
            self.spu_job_failed(sid, job)
            info = to_info(exc.cause, rank=self.rank, op=exc.label, job=job, remote=True)
            log.info(
                "job %s failed at op %s: %s",
                job,
                exc.label,
                info.message[:200],
                extra={"session": sid, "job": job, "error": info.message[:200]},
            )
            return Failed(sid, job, self.rank, info)
        except BaseException as exc:  # user code may raise SystemExit: still a failed job
            self.failed += 1
            self.spu_job_failed(sid, job)
            return Failed(sid, job, self.rank, to_info(exc, rank=self.rank, op="inputs", job=job))
        finally:
            self._active.discard((sid, job))
            self._runs.pop((sid, job), None)
            stopped = self._end(sid, job)
        if self.closed(sid) or stopped:
            self.spu_job_failed(sid, job)
            return None
        values: dict[int, Any] = {}
        metas: dict[int, str] = {}
        for i, value in enumerate(outputs):
            if value is ABSENT:
                continue
            self.store.put(sid, output_uri(job, i), value)
            metas[i] = describe(value)
            if i in msg.inline and is_small(value):
                values[i] = value
        self.done += 1
        stats = {"run_s": time.monotonic() - started, "started": wall, "ops": run.spans}
        return Done(sid, job, self.rank, values, stats, metas)

    def _resolve(self, sid: str, binding: Any) -> Any:
        if binding is None:
            return ABSENT
        if isinstance(binding, Lit):
            return binding.value
        if isinstance(binding, str):
            return self.store.get(sid, binding)
        raise SessionError(f"bad input binding {binding!r}")

    def _end(self, sid: str, job: str) -> str | None:
        """The job's run ended here: free its moves; why it was stopped, if it was."""
        self.mailbox.end((sid, job))
        return self._aborted.pop((sid, job), None)

    def _stop(self, sid: str, job: str, reason: str) -> None:
        """Wake everything ``job`` waits on (moves, SPU messages, sends) with ``reason``."""
        why = f"job {job} aborted: {reason}"
        self._aborted[(sid, job)] = why
        self.mailbox.close((sid, job), why)
        if self.spu is not None:
            self.spu.wake()

    def abort(self, msg: Abort) -> None:
        self._stop(msg.session, msg.job, msg.error.message)
        self.spu_job_failed(msg.session, msg.job)
        self.store.drop_job(msg.session, msg.job)

    # -- data and names -------------------------------------------------------------------
    def fetch(self, msg: Fetch, reply_now: Callable[[Record], None]) -> None:
        if self.store.has(msg.session, msg.uri):  # answer at once, even during a long job
            reply_now(self._fetch_reply(msg))
            return
        self._submit(msg.session, lambda: self.post(self._fetch_reply(msg)))

    def _fetch_reply(self, msg: Fetch) -> Reply:
        try:
            value = self.store.get(msg.session, msg.uri)
            if not self.trusted:  # refuse here, with a reason, rather than fail to encode
                check_safe(value, f"to the driver (fetch of {msg.uri} from rank {self.rank})")
            return Reply(msg.req, value=value)
        except Exception as exc:
            return Reply(
                msg.req, error=to_info(exc, rank=self.rank, op="fetch", with_traceback=False)
            )

    def delete(self, msg: Delete) -> None:
        uris = msg.uris.get(self.rank, [])
        self._submit(msg.session, lambda: self.store.delete(msg.session, uris))

    def save(self, msg: SaveSymbol) -> None:
        def task() -> None:
            try:
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

        self._submit(msg.session, task)

    def unsave(self, msg: DeleteSymbol) -> None:
        def task() -> None:
            try:
                check_name(msg.name)  # whoever relays it, no file outside the data root
                self.store.delete(msg.session, [symbol_uri(msg.name)])
                if msg.persist and self.store.disk is not None:
                    self.store.disk.delete(msg.name)
                self.post(Ack(msg.req, self.rank))
            except Exception as exc:  # a bad name, a disk error: the driver hears of it
                self.post(Ack(msg.req, self.rank, to_info(exc, rank=self.rank, op="delete")))

        self._submit(msg.session, task)

    # -- sessions -------------------------------------------------------------------------
    def close_session(self, sid: str, reason: str) -> None:
        self._closed[sid] = reason
        for s, job in list(self._active):
            if s == sid:
                self._stop(s, job, reason)
        self.mailbox.close_where(lambda job: job[0] == sid, f"session {sid} closed: {reason}")
        if self.spu is not None:
            self.spu.mailbox.close_where(
                lambda lane: lane.startswith(f"{sid}/"), f"session {sid} closed: {reason}"
            )
        with self._lock:
            self.spu_failures.pop(sid, None)
            service = self._extensions.get("spu")
        if service is not None:
            service.drop_lanes(sid)
        self.store.close(sid)
        if self._pool.has_work(sid):  # whatever is still queued may have recreated objects

            def forget() -> None:
                self.store.close(sid)

            self._pool.submit(sid, forget)

    def close_all(self, reason: str) -> None:
        for sid in self.store.session_ids() + self._pool.sessions():
            self.close_session(sid, reason)

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
            "objects": self.store.count(),
            "sessions": len(self.store.session_ids()),
            "jobs_running": len(self._active),
            "job_threads": self._pool.threads,
            "jobs_done": self.done,
            "jobs_failed": self.failed,
            "jobs_inline": self.inline,
            "moves_pending": self.mailbox.pending()[0],
            "moves_duplicate": self.mailbox.duplicates,
            "moves_late": self.mailbox.late,
            "moves_held": self.mailbox.held(),
            "moves_dropped": self.mailbox.held_dropped + self.mailbox.overflow,
            "bytes_out": self.peers.bytes_out,
        }
