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
template as its value). A plaintext repeat's common case (a program of one call, no inputs
here, its template kept) is one call, ``InlineJobs.run_repeat``, whose frame the I/O
thread's turn sends itself; what it does not take it leaves, untouched, to ``run_now``.
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
    _timeout: Callable[[Exec], float | RunFailed]
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
        any other job, with nothing done: then :meth:`handle` it.

        The ``Done`` goes out as soon as it is built and the job was not stopped meanwhile;
        the state's bookkeeping of the job's end follows the send, so the broker (on the
        other core) reads the answer meanwhile. Nothing the broker sends next can overtake
        that bookkeeping: this thread reads it only afterwards. A program whose plan
        compiles (``inline_run.py``) runs compiled, its ``Done`` packed from its fields
        (plaintext, or small scalars sealed); any other the way a pooled job runs.

        ``job``: the job to run is ``msg`` but for this job id (a repeat the I/O thread
        read by its id alone, ``RepeatExecs.repeat_job``); a program that does not
        compile then runs from a record of it."""
        if job is None:
            job = msg.job
        t0 = time.monotonic()  # the state's clock, and the run's start
        graph = self.state.begin_inline(msg, t0, job)  # without the lock: see its docstring
        if graph is None:
            return False
        digest = msg.digest
        compiled = self._compiled.get(digest)
        if compiled is None and digest not in self._compiled:  # its first inline run
            compiled = self._compile(digest, graph)
        end: RunEnd | Done | None
        if compiled is None:
            end = self._run(_with_job(msg, job), graph, tracked=False)
        else:
            end = self._run_compiled(msg, job, compiled, t0)
        if end is not None:  # else answered as frames, and its end booked
            self._end(end)
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
        """:meth:`run_now` for a plaintext program's next ``Exec``, ``msg`` but for job id
        ``job`` (``RepeatExecs.repeat_frame``), in its common case written out as one call
        (``Worker._turn``'s, for ``_on_repeat``, ``run_now``, ``_run_compiled`` and the
        Done's post): a compiled program of one call and one op, no inputs on this rank,
        the timeout it had last, and a Done template kept for its session. Its checks and
        bookkeeping are :meth:`run_now`'s, in its order (``WorkerState.begin_inline``, the
        run, the output stored, the stop check, ``end_inline``); the one difference is that
        the end is booked just before the send rather than just after it (both on this
        thread, before the broker's next message is read; a stop landing between the check
        and the send is one that came after the answer either way).

        Returns the Done's frame for the caller to send on the I/O thread's dealer; b"" if
        the job was taken and answered otherwise (failed, aborted, stopped meanwhile, or an
        output the template does not pack: as :meth:`run_now` answers it); None, with
        nothing done, for a job it does not take (then the full path: ``_on_repeat``).
        ``tests/test_fused_repeat.py`` compares the two paths' answers byte for byte."""
        compiled = self._compiled.get(msg.digest)
        if compiled is None or self.post_frame is None or self.seal_scalars is not None:
            return None
        call, only, shape, sid = compiled.call, compiled.only, self._one_span, msg.session
        asked, cap, _ = self._last_timeout  # the timeout as _run_compiled finds it: kept
        if (
            call is None
            or not only
            or shape[1] is not compiled
            or shape[0] != sid
            or (template := shape[2]) is None
            or msg.timeout_s != asked
            or cap != self.job_timeout_s
            or msg.bindings.get(self.rank)
        ):
            return None
        t0 = time.monotonic()  # the state's clock, and the run's start
        state = self.state
        if state.begin_inline(msg, t0, job) is None:  # nothing changed: the full path
            return None
        wall = time.time()
        try:  # _run_compiled's one call, as it makes it
            try:
                first = call()
            except (JobAbortedError, OpFailed):
                raise
            except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt too
                raise OpFailed(only[1], exc) from exc
        except OpFailed as exc:
            self._end(self._op_failed(sid, job, exc, t0))
            return b""
        except JobAbortedError:
            self._end(RunAborted(sid, job, time.monotonic() - t0))
            return b""
        t1 = time.monotonic()
        end: RunEnd | Done | None
        try:
            scalar = SCALAR_NAMES.get(type(first))
            held = 0 in msg.inline
            frame = (
                None
                if scalar is None
                else template.frame(job, first, held, scalar, t1 - t0, wall, 0.0, t1 - t0)
            )
            if scalar is None or frame is None:  # not packed: _run_compiled's other answers
                spans = [[*only, 0.0, t1 - t0]]
                end = self._answer(msg, job, [first], spans, scalar, t0, t1, wall)
            else:
                self.store.put_output(sid, job, first)
                if state.clean[2] == state.stops or not state.stopped_inline(sid, job):
                    lock = self._lock
                    lock.acquire()
                    try:
                        state.end_inline(sid, job, t1 - t0)
                    finally:
                        lock.release()
                    return frame
                # stopped meanwhile: the record run_now reports (RunFinished: freed, unsaid)
                stats = pack_stats(t1 - t0, wall, [[*only, 0.0, t1 - t0]])
                values: dict[int, Any] = {0: first} if held else {}
                end = done_record(sid, job, self.rank, values, stats, {0: scalar}, [])
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

    def _run_compiled(
        self, msg: Exec, job: str, compiled: InlineRun, t0: float
    ) -> RunEnd | Done | None:
        """:meth:`_run` for an inline run of a compiled program (``t0``: its start). In
        plaintext, and in secure mode when its outputs are small scalars (sealed here for
        the job's driver), its ``Done`` is packed from its fields and posted here, and the
        state books its end (None); otherwise its ``Done``, or how it failed, as ``_run`` says.
        ``job``: the job's id (``msg`` may be an earlier job of the program)."""
        sid = msg.session
        try:
            asked, cap, timeout = self._last_timeout  # _timeout's shortcut, without its call
            if msg.timeout_s != asked or cap != self.job_timeout_s:
                worked_out = self._timeout(msg)
                if isinstance(worked_out, RunFailed):
                    return worked_out
                timeout = worked_out
            mine = msg.bindings.get(self.rank)
            call = compiled.call
            spans: list[list[Any]] | None = None  # the one call's: (op, label, 0.0, t1 - t0)
            if call is not None and not mine:  # one call, no inputs (most): made here
                wall = time.time()
                try:  # compiled.run's one step, written out (a call and its lists less)
                    first = call()
                except (JobAbortedError, OpFailed):
                    raise
                except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt too
                    raise OpFailed(compiled.only[1], exc) from exc  # type: ignore[index]
                t1 = time.monotonic()
            else:
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
                first = outputs[0] if compiled.single else ABSENT
        except OpFailed as exc:
            return self._op_failed(sid, job, exc, t0)
        except JobAbortedError:
            return RunAborted(sid, job, time.monotonic() - t0)
        except BaseException as exc:
            info = to_info(exc, rank=self.rank, op="inputs", job=job)
            return RunFailed(sid, job, time.monotonic() - t0, info)
        # Three answers, nested on purpose: a one-op scalar's Done joined from the template,
        # else one packed from its fields (post_frames), else a record; each sends, then
        # books (end_inline). Folding the send-and-book into a method would add a Python
        # call per job to the path tests/test_worker_calls.py counts.
        try:
            scalar = SCALAR_NAMES.get(type(first))
            if scalar is not None and self.post_frame is not None and compiled.only:
                # one op, one scalar output (most): the Done joined from parts (in secure
                # mode with the value sealed for the job's driver first: its box, bytes)
                shape = self._one_span
                if shape[1] is not compiled or shape[0] != sid:
                    shape = self._one_span_done(sid, compiled)
                start, end = (0.0, t1 - t0) if spans is None else spans[0][2:]
                held, template, seal = 0 in msg.inline, shape[2], self.seal_scalars
                if template is None:
                    frame = None
                elif seal is None:
                    frame = template.frame(job, first, held, scalar, t1 - t0, wall, start, end)
                else:  # secure mode: the value sealed for the job's driver first (a box)
                    sealed = seal(sid, job, {0: first} if held else {})
                    frame = (
                        None  # not sealed: the general path below says why
                        if sealed is None
                        # b"": sealed, yet no frame (a long job id, say): the record below
                        else template.frame(
                            job, sealed.get(0), held, scalar, t1 - t0, wall, start, end
                        )
                        or b""
                    )
                if frame is not None:
                    self.store.put_output(sid, job, first)
                    state = self.state  # _not_stopped, written out
                    if frame and (
                        state.clean[2] == state.stops or not state.stopped_inline(sid, job)
                    ):
                        self.post_frame(frame)
                        lock = self._lock
                        lock.acquire()
                        try:
                            state.end_inline(sid, job, t1 - t0)
                        finally:
                            lock.release()
                        return None
                    # stopped meanwhile (or sealed without a frame): a record, which the
                    # seal's outbound seals for the driver it answered (WorkerSeal)
                    metas: dict[int, str] = {0: scalar}
                    values: dict[int, Any] = {0: first} if held else {}
                    stats = pack_stats(t1 - t0, wall, [[*compiled.only, start, end]])
                    return done_record(sid, job, self.rank, values, stats, metas, [])
            if spans is None:  # the one call's run, in full
                spans = [[*compiled.only, 0.0, t1 - t0]]  # type: ignore[misc]
                outputs = [first]
            return self._answer(msg, job, outputs, spans, scalar, t0, t1, wall)
        except BaseException as exc:  # the thread must report whatever happened
            error = to_info(exc, rank=self.rank, op="run", job=job)
            return RunFailed(sid, job, time.monotonic() - t0, error)

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
