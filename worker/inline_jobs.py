"""The job shell's inline path: a program's repeat quick job, run whole on the I/O thread.

:class:`InlineJobs` is the half of :class:`~mpl.worker.jobs.Jobs` that runs a job the
state lets run inline with nothing else to decide (``WorkerState.begin_inline``): its
plan compiled once (``inline_run.py``), its outputs stored, its ``Done`` posted, then the
state's bookkeeping of its end; no events or actions in between. A program of one call
without arguments (``InlineRun.call``, most) is that call, made here. A plaintext job comes
as a job id the I/O thread read by comparison with the program's last ``Exec``
(``RepeatExecs.repeat_frame``), and its ``Done`` leaves as frames packed from its fields:
no record is made on the way (a one-op run's one scalar: joined from the program's
template, ``OneSpanDone``). So does a secure job's whose outputs are small scalars, sealed
for the job's driver first (``WorkerSeal.sealed_scalars``; one scalar's box joined from the
template as its value). Every inline run is one call, ``InlineJobs.run_repeat``
(``run_now`` posts the frame it returns): its common case (a program of one call, no
inputs here, its template kept) written out, the store's ``put_output`` and the state's
``end_inline`` with it; a plaintext repeat's frame the I/O thread's turn sends itself.
The rest of the job shell (events, the pool, tasks) is ``jobs.py``'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mpl.wire.done_pack import OneSpanDone, own_done_fields
from mpl.wire.errors import JobAbortedError, SessionError
from mpl.wire.graph import Graph
from mpl.wire.jobs import Done, Exec
from mpl.wire.progress import FIRST_AFTER_S
from mpl.wire.record import Record, pinned_fields
from mpl.wire.remote import to_info
from mpl.wire.run_stats import pack_stats, run_seconds
from mpl.worker.inline_run import InlineRun
from mpl.worker.interpreter import ABSENT, OpFailed, Plan
from mpl.worker.outputs import SCALAR_NAMES
from mpl.worker.state import WorkerState
from mpl.worker.state_events import RunAborted, RunFailed, RunFinished
from mpl.worker.store import ObjectStore

__all__ = ["InlineJobs", "done_record"]

RunEnd = RunFinished | RunFailed | RunAborted
_NOT_BEGUN = ("",)  # WorkerState.jobs' entry of a job it does not know (end_inline's)


class InlineJobs:
    """The inline path of the job shell (mixed into ``Jobs``, which sets these attributes
    and provides the runs' common parts)."""

    state: WorkerState
    rank: int
    job_timeout_s: float
    post: Callable[[Record], None]
    post_frames: Callable[[list[Any]], None] | None
    post_frame: Callable[[bytes], None] | None
    _one_span: tuple[str, InlineRun | None, OneSpanDone | None]
    seal_scalars: Callable[[str, str, dict[int, Any]], dict[int, bytes] | None] | None
    _lock: threading.Lock
    _compiled: dict[str, InlineRun | None]
    _last_timeout: tuple[float, float, float]
    _inline: tuple[str, str, InlineRun, float, float] | None
    _reports: Callable[[int, int, float], float]
    report: Callable[[Any], None]
    _plan: Callable[[str, Graph], Plan]
    _run: Callable[..., Done | RunFailed | RunAborted]
    _timeout: Callable[[Exec, str], float | RunFailed]
    _resolve: Callable[[str, Any], Any]
    _op_failed: Callable[[str, str, OpFailed, float], RunFailed]
    store: ObjectStore
    _store_outputs: Callable[
        [str, str, tuple[int, ...], list[Any]], tuple[dict[int, Any], dict[int, str]]
    ]

    def run_now(self, msg: Exec, job: str | None = None) -> bool:
        """A repeat quick job, whole, on the calling (I/O) thread, when the state says it
        may run inline with nothing else to decide (``WorkerState.begin_inline``): the run,
        its outputs stored, its ``Done`` posted; no events or actions in between. False for
        any other job, with nothing done: then :meth:`handle` it. :meth:`run_repeat`, its
        Done's frame, if it returns one, posted (``post_frame``).

        ``job``: the job to run is ``msg`` but for this job id (a repeat the I/O thread
        read by its id alone, ``RepeatExecs.repeat_job``)."""
        frame = self.run_repeat(msg, msg.job if job is None else job)
        if frame is None:
            return False
        if frame:
            self.post_frame(frame)  # type: ignore[misc]  # (a frame only with post_frame)
        return True

    def _end(self, end: RunEnd | Done) -> None:
        """Answer and book an inline run that ended as ``end``: a Done posted (as a record)
        and its end booked, unless the job was stopped meanwhile; else the state's
        ordinary path (``report``)."""
        if type(end) is Done:
            sid, job = end.session, end.job
            if self._not_stopped(sid, job):
                self.post(end)
                lock = self._lock
                lock.acquire()  # not `with`: acquire and release are a third of its cost
                try:
                    self.state.end_inline(sid, job, run_seconds(end.stats))
                finally:
                    lock.release()
                return
            self.report(RunFinished(sid, job, run_seconds(end.stats), end))  # stopped meanwhile
            return
        self.report(end)  # failed or aborted: the state's ordinary path

    def run_repeat(self, msg: Exec, job: str) -> bytes | None:
        """The one inline run of a job, ``msg`` but for job id ``job`` (a plaintext
        program's next ``Exec``, ``RepeatExecs.repeat_frame``, or any other the state lets
        run inline: :meth:`run_now`), called by ``Worker._turn`` itself for a plaintext
        repeat. The state begins it (``WorkerState.begin_inline``) or declines; it runs
        compiled (``inline_run.py``) if its plan compiles, else as a pooled job runs; its
        outputs are stored, its Done answered and its end booked, unless it was stopped
        meanwhile (then the state's ordinary path: outputs freed, nothing said).

        The common case (a compiled program of one call and one op, no inputs on this rank,
        the timeout it had last, one scalar output and a Done template kept for its
        session: nearly every repeat quick job) is written out here, the store's
        ``put_output`` and the state's ``end_inline`` with it: a Python call each is most
        of what they cost. Its Done's frame is returned for the caller to send (on the I/O
        thread's dealer; ``run_now``: ``post_frame``), its end booked just before (both on
        this thread, before the broker's next message is read: a stop landing between the
        check and the send is one that came after the answer either way).

        Returns that frame; b"" if the job was taken and answered otherwise (failed,
        aborted, stopped meanwhile, or a Done the template does not pack: posted here);
        None, with nothing done, for a job the state does not let run inline (then
        ``handle`` it). ``tests/test_fused_repeat.py`` compares its answers and books, byte
        for byte, with those of the uncompiled run (the interpreter's, ``Jobs._run``)."""
        t0 = time.monotonic()  # the state's clock, and the run's start
        state = self.state
        graph = state.begin_inline(msg, t0, job)  # without the lock: see its docstring
        if graph is None:
            return None
        digest = msg.digest
        compiled = self._compiled.get(digest)
        if compiled is None:
            if digest not in self._compiled:  # its first inline run
                compiled = self._compile(digest, graph)
            if compiled is None:  # not compilable: the interpreter's run, as a pooled job's
                self._end(self._run(_with_job(msg, job), graph, tracked=False))
                return b""
        sid, call, only = msg.session, compiled.call, compiled.only
        spans: list[list[Any]] | None = None  # a run of steps': their spans
        asked, cap, timeout = self._last_timeout  # _timeout's shortcut, without its call
        if msg.timeout_s != asked or cap != self.job_timeout_s:  # (NaN never equals)
            worked_out = self._timeout_of(msg, job, t0)
            if isinstance(worked_out, RunFailed):
                self._end(worked_out)
                return b""
            timeout = worked_out
        if call is not None and not msg.bindings.get(self.rank):
            # one call, no inputs (most): made here
            wall = time.time()
            try:  # compiled.run's one step, written out (a call and its lists less)
                try:
                    first = call()
                except (JobAbortedError, OpFailed):
                    raise
                except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt too
                    raise OpFailed(only[1], exc) from exc  # type: ignore[index]
            except OpFailed as exc:
                self._end(self._op_failed(sid, job, exc, t0))
                return b""
            except JobAbortedError:
                self._end(RunAborted(sid, job, time.monotonic() - t0))
                return b""
            t1 = time.monotonic()
        else:
            ran = self._run_steps(msg, job, compiled, t0, timeout)
            if not isinstance(ran, tuple):
                self._end(ran)
                return b""
            first, outputs, spans, wall, t1 = ran
        end: RunEnd | Done | None
        # Three answers, nested on purpose: a one-op scalar's Done joined from the template,
        # else one packed from its fields (_answer), else a record; each books its end
        # (end_inline) and sends. A method for the first would add a call per job to the
        # path tests/test_worker_calls.py counts.
        try:
            scalar = SCALAR_NAMES.get(type(first))
            frame: bytes | None = None
            if scalar is not None and only is not None and self.post_frame is not None:
                # one op, one scalar output (most): the Done joined from parts (in secure
                # mode with the value sealed for the job's driver first: its box, bytes)
                shape = self._one_span
                if shape[1] is not compiled or shape[0] != sid:
                    shape = self._one_span_done(sid, compiled)
                start, stop = (0.0, t1 - t0) if spans is None else spans[0][2:]
                held, template, seal = 0 in msg.inline, shape[2], self.seal_scalars
                if template is None:
                    pass  # packed from the fields: _answer
                elif seal is None:
                    frame = template.frame(job, first, held, scalar, t1 - t0, wall, start, stop)
                else:  # secure mode: the value sealed for the job's driver first (a box)
                    sealed = seal(sid, job, {0: first} if held else {})
                    frame = (
                        None  # not sealed: _answer says why
                        if sealed is None
                        # b"": sealed, yet no frame (a long job id, say): the record below
                        else template.frame(
                            job, sealed.get(0), held, scalar, t1 - t0, wall, start, stop
                        )
                        or b""
                    )
            if frame is None:  # not packed from a template: _answer's fields or record
                if spans is None:  # the one call's run, in full
                    spans = [[*only, 0.0, t1 - t0]]  # type: ignore[misc]
                    outputs = [first]
                end = self._answer(msg, job, outputs, spans, scalar, t0, t1, wall)
            else:
                # ObjectStore.put_output, written out: its one output, under its job id
                # (a job of several held somewhere: the id may name one, put_output counts)
                store = self.store
                lock = store._lock
                lock.acquire()  # not `with`: acquire and release are a third of its cost
                try:
                    several = store._extra
                    if not several:
                        held_jobs = store._outputs.get(sid)
                        if held_jobs is None:
                            held_jobs = store._outputs[sid] = {}
                        held_jobs[job] = first
                finally:
                    lock.release()
                if several:
                    store.put_output(sid, job, first)
                if frame and (state.clean[2] == state.stops or not state.stopped_inline(sid, job)):
                    # WorkerState.end_inline, written out (under the state's lock)
                    lock = self._lock
                    lock.acquire()
                    try:
                        state.done += 1
                        key = (sid, job)
                        ended = state.jobs.pop(key, _NOT_BEGUN)[0]
                        if ended:
                            quick = t1 - t0 <= state.inline_s
                            if state.quick.get(ended) is quick:
                                state.quick.move_to_end(ended)
                            else:
                                state.quick[ended] = quick
                        if state.aborted:  # (most often empty: no call)
                            state.aborted.pop(key, None)
                    finally:
                        lock.release()
                    return frame
                # stopped meanwhile (or sealed without a frame): a record (the seal's
                # outbound seals it for the driver it answered: WorkerSeal)
                stats = pack_stats(t1 - t0, wall, [[*only, start, stop]])  # type: ignore[misc]
                values: dict[int, Any] = {0: first} if held else {}
                end = done_record(sid, job, self.rank, values, stats, {0: scalar}, [])  # type: ignore[dict-item]
        except BaseException as exc:  # the thread must report whatever happened
            error = to_info(exc, rank=self.rank, op="run", job=job)
            end = RunFailed(sid, job, time.monotonic() - t0, error)
        if end is not None:
            self._end(end)
        return b""

    def _not_stopped(self, sid: str, job: str) -> bool:
        """Whether a job the state began inline is still to be answered: neither aborted
        nor its session closed while it ran (then ``RunFinished`` tells the state, which
        frees its outputs and says nothing). Read without the lock
        (``WorkerState.stopped_inline``); a stop that comes just after is one that came
        after the answer, as it may for any job."""
        return not self.state.stopped_inline(sid, job)

    def _compile(self, digest: str, graph: Graph) -> InlineRun | None:
        """The compiled run of program ``digest`` on this rank (None: not compilable)."""
        if len(self._compiled) > 512:
            self._compiled.clear()
        compiled = self._compiled[digest] = InlineRun.compile(self._plan(digest, graph))
        return compiled

    def _timeout_of(self, msg: Exec, job: str, t0: float) -> float | RunFailed:
        """``_timeout`` for :meth:`run_repeat` (a timeout other than the last one's), or
        how the job fails: whatever happened, the thread that runs it must report it."""
        try:
            return self._timeout(msg, job)
        except BaseException as exc:
            info = to_info(exc, rank=self.rank, op="inputs", job=job)
            return RunFailed(msg.session, job, time.monotonic() - t0, info)

    def _run_steps(
        self, msg: Exec, job: str, compiled: InlineRun, t0: float, timeout: float
    ) -> tuple[Any, list[Any], list[list[Any]], float, float] | RunEnd:
        """:meth:`run_repeat`'s run of a compiled program other than one call without
        inputs (inputs on this rank, several steps; ``timeout``: the job's): its first
        output (ABSENT if it has several), its outputs, its spans, its start on the wall
        clock and its end; or how it failed."""
        sid = msg.session
        try:
            mine = msg.bindings.get(self.rank)
            inputs: list[Any] | tuple[()] = ()
            if mine:
                inputs = [self._resolve(sid, b) for b in mine]
                if len(inputs) != len(compiled.plan.graph.inputs):
                    raise SessionError(
                        f"job binds {len(inputs)} inputs on rank {self.rank}, "
                        f"the graph has {len(compiled.plan.graph.inputs)}"
                    )
            self._inline = (sid, job, compiled, t0, timeout)  # for _report_inline
            wall = time.time()
            outputs, spans, t1 = compiled.run(inputs, t0, t0 + FIRST_AFTER_S, self._reports)
            return outputs[0] if compiled.single else ABSENT, outputs, spans, wall, t1
        except OpFailed as exc:
            return self._op_failed(sid, job, exc, t0)
        except JobAbortedError:
            return RunAborted(sid, job, time.monotonic() - t0)
        except BaseException as exc:
            info = to_info(exc, rank=self.rank, op="inputs", job=job)
            return RunFailed(sid, job, time.monotonic() - t0, info)

    def _answer(
        self,
        msg: Exec,
        job: str,
        outputs: list[Any],
        spans: list[list[Any]],
        scalar: str | None,
        t0: float,
        t1: float,
        wall: float,
    ) -> Done | None:
        """The answer of a compiled inline run whose Done no template packs: its outputs
        stored, its Done packed from its fields and posted (``post_frames``) and its end
        booked (None), else its Done as a record. ``scalar``: the one output's meta, if it
        is a scalar. Raises what storing or packing raised (its callers report it)."""
        sid = msg.session
        metas: dict[int, str]
        values: dict[int, Any]
        if scalar is not None:  # one scalar output (most): _store_outputs, written out
            metas = {0: scalar}
            values = {0: outputs[0]} if 0 in msg.inline else {}
            self.store.put_outputs(sid, job, outputs)
        else:
            values, metas = self._store_outputs(sid, job, msg.inline, outputs)
        stats = pack_stats(t1 - t0, wall, spans)  # one blob, unread on the way
        post_frames = self.post_frames
        if post_frames is not None:
            # secure mode: small scalars sealed here for the job's driver (else, or
            # without a driver, the Done goes to post, whose seal says why)
            seal = self.seal_scalars
            sealed = values if seal is None else seal(sid, job, values)
            frames = (
                own_done_fields(sid, job, self.rank, sealed, stats, metas)
                if sealed is not None
                else None
            )
            state = self.state  # _not_stopped, written out (a call less per job)
            if frames is not None and (
                state.clean[2] == state.stops or not state.stopped_inline(sid, job)
            ):
                post_frames(frames)
                lock = self._lock
                lock.acquire()
                try:
                    state.end_inline(sid, job, t1 - t0)
                finally:
                    lock.release()
                return None
        return done_record(sid, job, self.rank, values, stats, metas, [])

    def _one_span_done(
        self, sid: str, compiled: InlineRun
    ) -> tuple[str, InlineRun | None, OneSpanDone | None]:
        """The Done template of ``compiled``'s runs in session ``sid`` (None: its session or
        label does not pack into one), kept for the next job of the same."""
        assert compiled.only is not None
        try:
            template: OneSpanDone | None = OneSpanDone(sid, self.rank, *compiled.only)
        except Exception:  # packed from the fields each time instead
            template = None
        shape = self._one_span = (sid, compiled, template)
        return shape


# done_record fills a Done in from one dict naming every field
_DONE_FIELDS = pinned_fields(
    Done, ("session", "job", "rank", "values", "stats", "metas", "saved"), "mpl.worker.inline_jobs"
)


def done_record(
    session: str,
    job: str,
    rank: int,
    values: dict[int, Any],
    stats: bytes,
    metas: dict[int, str],
    saved: list[Any],
) -> Done:
    """``Done(session, job, rank, values, stats, metas, saved)`` of a run this worker made,
    filled in directly (as decode fills in the records it checked): ``__init__`` would set
    each field through the records' immutability guard. Every field is named here, and
    ``_DONE_FIELDS`` keeps them in step with the record."""
    done: Done = object.__new__(Done)
    done.__dict__.update(
        {
            "session": session,
            "job": job,
            "rank": rank,
            "values": values,
            "stats": stats,
            "metas": metas,
            "saved": saved,
        }
    )
    return done


def _with_job(msg: Exec, job: str) -> Exec:
    """``msg`` with job id ``job`` (itself if it has it), built as decode builds it."""
    if job is msg.job:
        return msg
    other: Exec = object.__new__(Exec)
    fields = other.__dict__
    fields.update(msg.__dict__)
    fields["job"], fields["bindings"] = job, dict(msg.bindings)
    return other
