"""Jobs in flight without waiting: the pump behind ``mp.submit``.

A caller hands the pump an ``Exec`` and gets a ``concurrent.futures.Future`` back at once.
One pump thread per client owns one DEALER (made like any calling thread's, by
``Client._socket``), sends what callers queued, and settles futures as the broker's
``JobResult``s arrive, so one thread can keep many jobs in flight and any thread may wait on
the futures (``concurrent.futures.wait`` / ``as_completed`` work on them as on any other).
The Execs queued since the pump's last turn go out as one batch (``mpl.wire.batch``, a
program a job needs alone before it), and a batch of answers is read one answer at a time.

Every future is settled, never left waiting: by its result or error, by its deadline
(``MplTimeoutError``, and the job is cancelled at the broker), by a silent broker, by a
restarted broker that forgot the job's session (``SessionError``, within ``_IDLE_MS`` of the
client learning it), or by the client closing (``MplError`` naming the job).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from mpl.driver.job_future import INTERRUPTED, JobFuture, settle
from mpl.wire.batch import coalesce, is_batch, split_batch
from mpl.wire.codec import SLICE_BELOW, encode, from_wire, to_wire
from mpl.wire.control import Bye, Refused
from mpl.wire.errors import MplError, MplTimeoutError, ProtocolError, SessionError
from mpl.wire.exec_pack import exec_frames
from mpl.wire.graph import Graph
from mpl.wire.jobs import Cancel, Exec, JobResult, Program
from mpl.wire.printable import one_line
from mpl.wire.progress import Progress
from mpl.wire.record import Record
from mpl.wire.remote import from_info
from mpl.wire.result_read import read_answer, refused_answer_job
from mpl.wire.sockets import drain, send_frames

if TYPE_CHECKING:
    from mpl.driver.client import Client

__all__ = ["JobPump", "Pending"]

log = logging.getLogger("mpl.driver")
_IDLE_MS = 100  # the pump wakes this often to check deadlines and the broker's silence
_DRAIN = 256  # results settled per wake-up at most, before queued jobs are sent again
_POLLIN = int(zmq.POLLIN)


class Pending:
    """One job handed to the pump: what to send, and the future to settle."""

    __slots__ = (
        "attempts",
        "deadline",
        "finish",
        "future",
        "graph",
        "keep",
        "limit",
        "msg",
        "plain",
        "stopped",
    )

    def __init__(
        self,
        msg: Exec,
        graph: Graph,
        deadline: float,  # monotonic; the future fails with MplTimeoutError after it
        limit: float,  # the job's timeout, for messages
        future: JobFuture,
        finish: Callable[[JobResult], Any],  # runs on the pump thread; returns the result
        keep: Any = None,  # what must stay alive until the job has run (its input Values)
    ) -> None:
        self.msg = msg
        self.graph = graph
        self.deadline = deadline
        self.limit = limit
        self.future = future
        self.finish = finish
        self.keep = keep
        self.attempts = 0
        # secure mode: the bindings before sealing, while the job may still be sealed anew
        # for a worker that refused it (JobPump._take); None for a job that would not be
        # (DriverSeal.may_send_again)
        self.plain: dict[int, Any] | None = None
        # a wait on its future was interrupted and its Cancel sent: never sent again (an
        # answer asking for a resend came from a broker the Cancel found no job on)
        self.stopped = False


class JobPump:
    """Sends queued jobs and settles their futures, on one thread of its own."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._queue: collections.deque[Pending] = collections.deque()
        self._inflight: dict[str, Pending] = {}
        # when _expire next looks at the jobs in flight: their soonest deadline, and at
        # least every _IDLE_MS for a silent or restarted broker (not on every wake-up, so a
        # wake-up costs O(what arrived), not O(jobs in flight))
        self._check_at = time.monotonic()
        self._unsent: list[Pending] = []  # in flight, but the socket's queue was full
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._woken = False  # a wake byte is on its way: later submits need not write one
        self._closing: str | None = None  # the reason futures still pending fail with
        self._interrupted: list[JobFuture] = []  # waits on them were interrupted (Ctrl-C)
        self._thread = threading.Thread(target=self._run, name="mpl-driver-pump", daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        """Jobs queued or in flight."""
        with self._lock:
            return len(self._queue) + len(self._inflight)

    def put(self, pending: Pending) -> None:
        """Queue a job; its future settles on the pump thread."""
        with self._lock:
            if self._closing is not None:
                raise MplError(self._closing)
            self._queue.append(pending)
            if self._woken:
                return
            self._woken = True
        os.write(self._wake_w, b"!")

    def interrupt(self, future: JobFuture) -> None:
        """A wait on ``future`` was interrupted (Ctrl-C, on any thread): the pump cancels
        its job, on the socket its Exec went out on, so the Cancel cannot overtake it."""
        with self._lock:
            self._interrupted.append(future)
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def close(self, reason: str) -> None:
        """Fail every pending future with ``reason`` and stop the thread (bounded wait)."""
        with self._lock:
            if self._closing is None:
                self._closing = reason
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")
        self._thread.join(5)
        if not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    # -- the pump thread -----------------------------------------------------------------
    def _run(self) -> None:
        sock: zmq.Socket[Any] | None = None
        try:
            sock = self._client._socket()
            # zmq_poll itself, on a list built once: zmq.Poller rebuilds its list and
            # wraps the answer in Python objects on every call
            watched: Any = [(sock, _POLLIN), (self._wake_r, _POLLIN)]
            while self._closing is None:
                # one wake-up handles everything ready: all queued jobs are sent and all
                # arrived results settled before the next poll
                results = False
                for item, _ in zmq.zmq_poll(watched, self._poll_ms()):
                    if item is sock:
                        results = True
                    else:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                self._send_queued(sock)
                if self._interrupted:
                    self._cancel_interrupted(sock)
                if results:
                    self._receive(sock)
                if time.monotonic() >= self._check_at:
                    self._expire(sock)
        except Exception as exc:  # the pump must never leave futures waiting
            log.exception("the job pump stopped")
            with self._lock:
                self._closing = self._closing or f"the driver's job pump failed: {exc!r}"
        finally:
            self._fail_all(MplError, self._closing or "the client is closed")
            if sock is not None:
                # the socket belongs to this thread: close it here, not from another thread
                with contextlib.suppress(Exception):
                    self._client._drop_thread_socket()

    def _poll_ms(self) -> int:
        return max(0, min(_IDLE_MS, int((self._check_at - time.monotonic()) * 1000) + 1))

    def _send_queued(self, sock: zmq.Socket[Any]) -> None:
        with self._lock:
            if not self._queue and not self._unsent:
                self._woken = False
                return
            batch = list(self._queue)
            self._queue.clear()
            self._woken = False
        unsent, self._unsent = self._unsent, []
        # those that waited for room first, unless their deadline settled them meanwhile
        retry = [p for p in unsent if self._inflight.get(p.msg.job) is p]
        pendings = [*retry, *batch]
        for p in pendings:
            self._inflight[p.msg.job] = p
            if p.deadline < self._check_at:
                self._check_at = p.deadline
        if len(pendings) == 1:
            p = pendings[0]
            self._send(sock, p, with_program=p.graph.digest not in self._client._programs)
        else:
            self._send_many(sock, pendings)

    def _send_many(self, sock: zmq.Socket[Any], pendings: list[Pending]) -> None:
        """Send several jobs, their header-only Execs coalesced into batches (a program a
        job needs goes alone, before it). Once the socket's queue is full, the rest wait in
        ``_unsent``, in order."""
        programs = self._client._programs
        seal = self._client.seal
        # each message: its frames, whether it may ride in a batch, the job it sends (None
        # for a program) and the program's digest
        messages: list[tuple[list[Any], bool, Pending | None, str]] = []
        planned: set[str] = set()
        limit = self._client.max_message
        for p in pendings:
            digest = p.graph.digest
            if digest not in programs and digest not in planned:
                program = seal.program(p.graph) if seal else Program(digest, p.graph)
                frames = encode(program)
                if self._refused(p, frames, "its program"):
                    continue
                messages.append((frames, False, None, digest))
                planned.add(digest)
            frames = exec_frames(p.msg)
            # one header within the broker's limit (most): no call
            if (len(frames) != 2 or len(frames[0]) + len(frames[1]) > limit) and self._refused(
                p, frames, "its Exec"
            ):
                continue
            messages.append((frames, True, p, digest))
        plan = coalesce([(frames, batchable) for frames, batchable, _, _ in messages])
        at = 0
        for frames, carried in plan:
            part = messages[at : at + carried]
            try:
                send_frames(sock, to_wire(frames))
            except zmq.Again:  # the rest wait for room, in order
                self._unsent += [job for _, _, job, _ in messages[at:] if job is not None]
                return
            at += carried
            for _, _, job, digest in part:
                if job is None:
                    programs.add(digest)
                else:
                    job.attempts += 1

    def _send(self, sock: zmq.Socket[Any], p: Pending, *, with_program: bool) -> None:
        """Send ``p`` without blocking the pump: while the socket's queue is full (a broker
        long away), it waits in ``_unsent`` for the next turn, its deadline still running."""
        try:
            if with_program:
                seal = self._client.seal
                program = seal.program(p.graph) if seal else Program(p.graph.digest, p.graph)
                frames = encode(program)
                if self._refused(p, frames, "its program"):
                    return
                send_frames(sock, to_wire(frames))
                self._client._programs.add(p.graph.digest)
            frames = exec_frames(p.msg)
            if (
                len(frames) != 2 or len(frames[0]) + len(frames[1]) > self._client.max_message
            ) and self._refused(p, frames, "its Exec"):
                return
            send_frames(sock, to_wire(frames))
        except zmq.Again:
            self._unsent.append(p)
            return
        p.attempts += 1

    def _refused(self, p: Pending, frames: list[Any], what: str) -> bool:
        """Fail ``p`` at once (True) if ``frames`` (the codec's form of a message it sends)
        hold a frame over the broker's limit, which would drop it with the connection."""
        limit = self._client.max_message
        if len(frames) == 2 and len(frames[0]) + len(frames[1]) <= limit:
            return False  # a header-only message within the limit (most): no call
        oversized = self._client._oversized(to_wire(frames), f"{what} (job {p.msg.job})")
        if oversized is None:
            return False
        if self._inflight.get(p.msg.job) is p:
            del self._inflight[p.msg.job]
        self._client.progress.end(p.msg.job, False)
        _fail(p, oversized)
        return True

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        # drain checks ZMQ_EVENTS between receives: no zmq.Again built at the end of each
        # wake-up; it stops after _DRAIN messages so queued sends are not held back long.
        # A batch of answers (mpl.wire.batch) is split and each read as if it came alone.
        # Futures are settled once the whole batch is read, in one pass: each settled
        # future may wake the thread waiting on it, which would otherwise contend for the
        # GIL with this loop for every result still to read (a futex wait and wake each time).
        ready: list[tuple[JobFuture, Any]] = []
        inflight, client = self._inflight, self._client
        safe = client.safe  # the client's rule (secure: the broker's answers, safely)
        end, plain = client.progress.end, client.seal is None
        try:
            for wired in drain(sock, _DRAIN):
                first = wired[0]  # the magic and the header (wire v4): cut in two
                if len(wired) == 1 and type(first) is zmq.Frame and len(first) < SLICE_BELOW:
                    one = first.bytes  # copied once, then sliced (from_wire, written out)
                    received = [one[:4], one[4:]]
                else:
                    received = from_wire(wired)
                if is_batch(received):  # several answers in one: each as if alone
                    try:
                        messages = split_batch(received)
                    except ProtocolError as exc:
                        log.warning("bad message from the broker: %s", one_line(exc))
                        continue
                else:
                    messages = [received]
                for frames in messages:
                    try:
                        # results come from other parties: pickles load only in a trusted
                        # cluster
                        msg = read_answer(frames, safe=safe)
                    except ProtocolError as exc:
                        log.warning("bad message from the broker: %s", one_line(exc))
                        self._refused_answer(frames, exc)
                        continue
                    # a plaintext job's value (most): _take's steps for it, without its call
                    if (
                        plain
                        and type(msg) is JobResult
                        and msg.error is None
                        and not msg.missing_program
                    ):
                        p = inflight.pop(msg.job, None)
                        if p is None:
                            continue  # an answer to a job that already timed out
                        end(msg.job, True)
                        try:
                            value = p.finish(msg)
                        except BaseException as exc:
                            _fail(p, exc)
                            continue
                        p.keep = None  # the job has run: its inputs may go
                        ready.append((p.future, value))
                    else:
                        self._take(sock, msg, ready)
        finally:
            settle(ready)

    def _refused_answer(self, frames: list[Any], exc: ProtocolError) -> None:
        """An answer refused on reading: if it is a job's in flight (its header says so),
        that job fails now, not at its deadline: its answer came and cannot be taken."""
        job = refused_answer_job(frames)
        if job is None or (p := self._inflight.pop(job, None)) is None:
            return
        self._client.progress.end(job, False)
        _fail(p, ProtocolError(f"job {job}: the answer could not be accepted: {exc}"))

    def _take(self, sock: zmq.Socket[Any], msg: Record, ready: list[tuple[JobFuture, Any]]) -> None:
        """Act on one message from the broker: a job's value joins ``ready``, a failure
        settles its future now."""
        if type(msg) is not JobResult:
            self._control(msg)
            return
        p = self._inflight.pop(msg.job, None)
        if p is None:
            return  # an answer to a job that already timed out
        if msg.missing_program:
            if p.stopped:  # the broker made no job of it: the Cancel stopped nothing to run
                self._client.progress.end(msg.job, False)
                _fail(p, MplError(f"job {msg.job}: {INTERRUPTED}"))
                return
            if p.attempts < 2:  # the broker lost the graph (or it overtook another socket's)
                self._inflight[msg.job] = p
                self._send(sock, p, with_program=True)
                return
            _fail(p, ProtocolError(f"the broker keeps losing program {p.graph.digest}"))
            return
        if msg.error is not None:
            seal = self._client.seal
            # a worker that forgot our stream: a new one, and the job sent once more, sealed
            # anew under its own id, if it was sealed for no process (DriverSeal.refused)
            if (
                seal is not None
                and seal.refused(msg.error, p.msg.bindings)
                and p.plain is not None
                and not p.stopped  # interrupted: the refusal is its answer (a new stream
            ):  # was begun above all the same, for the next job)
                self._again(sock, p, p.plain)
                return
            self._client.progress.end(msg.job, False)
            _fail(p, from_info(msg.error))
            return
        self._client.progress.end(msg.job, True)
        try:
            seal = self._client.seal
            value = p.finish(seal.result(p.msg.session, msg) if seal else msg)
        except BaseException as exc:
            _fail(p, exc)
            return
        p.keep = None  # the job has run: its inputs may go
        ready.append((p.future, value))

    def _again(self, sock: zmq.Socket[Any], p: Pending, bindings: dict[int, Any]) -> None:
        """Send ``p``'s job once more (never again: ``plain`` goes), its bindings sealed
        anew from ``bindings``."""
        seal = self._client.seal
        assert seal is not None
        m = p.msg
        p.plain = None
        try:
            p.msg = seal.exec(
                Exec(m.session, m.job, m.digest, m.ranks, bindings, m.inline, m.timeout_s)
            )
        except BaseException as exc:
            self._client.progress.end(m.job, False)
            _fail(p, exc)
            return
        self._inflight[m.job] = p
        self._send(sock, p, with_program=False)

    def _control(self, msg: Record) -> None:
        """A message from the broker that is not a job's result."""
        if isinstance(msg, Progress):
            self._client.progress.update(msg)
        elif isinstance(msg, Refused):
            error = from_info(msg.error)  # its text escaped, as any error from the broker
            self._fail_all(type(error), str(error.args[0]) if error.args else "")
        elif isinstance(msg, Bye):
            self._fail_all(SessionError, f"the broker at {self._client.address} shut down")

    def _expire(self, sock: zmq.Socket[Any]) -> None:
        now = time.monotonic()
        silence = self._client.watch.silence
        lost = self._client.watch.lost
        soonest = now + _IDLE_MS / 1000
        for job, p in list(self._inflight.items()):
            if silence is not None:
                del self._inflight[job]
                _fail(p, silence)
            elif p.msg.session in lost:  # its answer will never come from the new broker
                del self._inflight[job]
                _fail(
                    p,
                    SessionError(
                        f"job {job}: the broker at {self._client.address} restarted and lost "
                        f"session {p.msg.session}; open a new session"
                    ),
                )
            elif now >= p.deadline:
                del self._inflight[job]
                reason = f"the driver stopped waiting after {p.limit:g} s"
                with contextlib.suppress(zmq.Again):  # best effort: the broker's own deadline
                    send_frames(sock, to_wire(encode(Cancel(p.msg.session, job, reason))))
                _fail(
                    p,
                    MplTimeoutError(
                        f"job {job}: no answer from the broker at {self._client.address} "
                        f"within {p.limit:g} s"
                    ),
                )
            elif p.deadline < soonest:
                soonest = p.deadline
        self._check_at = soonest

    def _cancel_interrupted(self, sock: zmq.Socket[Any]) -> None:
        """Cancel the jobs whose waits were interrupted: the broker aborts each on every
        rank and answers with its error, which settles the future."""
        with self._lock:
            stopped, self._interrupted = set(self._interrupted), []
        for job, p in list(self._inflight.items()):
            if p.future in stopped:
                self._client.progress.end(job, False)
                if p in self._unsent:  # not sent yet (the queue to the broker was full)
                    self._unsent.remove(p)
                    del self._inflight[job]
                    _fail(p, MplError(f"job {job}: {INTERRUPTED} before it was sent"))
                    continue
                p.stopped = True  # whatever the broker answers, it is not sent again
                try:
                    send_frames(sock, to_wire(encode(Cancel(p.msg.session, job, INTERRUPTED))))
                except zmq.Again:  # the queue to the broker is full: next turn, while the
                    with self._lock:  # job is in flight (a dropped Cancel let it run on)
                        self._interrupted.append(p.future)

    def _fail_all(self, make: Callable[[str], BaseException], text: str) -> None:
        with self._lock:
            queued = list(self._queue)
            self._queue.clear()
        for p in [*queued, *self._inflight.values()]:
            _fail(p, make(f"job {p.msg.job}: {text}"))
        self._inflight.clear()
        self._unsent.clear()


def _fail(p: Pending, exc: BaseException) -> None:
    p.keep = None
    if not p.future.done():
        p.future.set_exception(exc)
