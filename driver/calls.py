"""Requests to the broker on the calling thread's own socket, and the wait for their answers.

Every calling thread gets its own DEALER (:class:`ThreadSocket`) and waits for its answer on
it, so a call costs one round trip and no hand-off between threads. :class:`BrokerCalls`
(the :class:`~mpl.driver.client.Client`'s base) sends a request and waits for the answer in
one loop, :meth:`BrokerCalls._wait`, whatever the request: the deadline in slices of
``_SLICE_MS`` (the last one shortened to end at the deadline), the
:class:`~mpl.driver.watch.BrokerWatch`'s verdicts on a silent, restarted or refusing broker,
and a read function that finds the caller's answer among what arrives. A job's JobResult is
read on a lean path first (:func:`mpl.wire.result_read.read_answer`); anything else (a
batch, a progress report, a late answer) the general way, each answer as if it came alone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from mpl.driver.job_progress import ProgressBoard
from mpl.driver.watch import BrokerWatch
from mpl.wire.batch import is_batch, split_batch
from mpl.wire.codec import decode, encode, foreign_version, from_wire, to_wire
from mpl.wire.control import Bye, Refused
from mpl.wire.curve import Curve
from mpl.wire.errors import (
    MessageTooLargeError,
    MplError,
    MplTimeoutError,
    ProtocolError,
    SessionError,
)
from mpl.wire.exec_pack import exec_frames
from mpl.wire.jobs import Exec, JobResult
from mpl.wire.limits import MAX_MESSAGE
from mpl.wire.printable import one_line
from mpl.wire.progress import Progress
from mpl.wire.record import Record
from mpl.wire.remote import from_info
from mpl.wire.result_read import read_answer, refused_answer_job
from mpl.wire.routing import driver_routing_id
from mpl.wire.sessions import Reply
from mpl.wire.sockets import configure, first_oversized, recv_frames, send_frames, too_large

__all__ = ["BrokerCalls", "ThreadSocket"]

log = logging.getLogger("mpl.driver")
_SLICE_MS = 100  # waits wake this often to notice a lost broker

_Key = TypeVar("_Key")


def _never(answer: Record) -> bool:
    return False


class ThreadSocket:
    """One thread's DEALER; closed when the thread's locals are collected or the client closes."""

    def __init__(self, client: BrokerCalls) -> None:
        self.sock = configure(client.ctx.socket(zmq.DEALER), linger_ms=0)
        if client.curve is not None:
            client.curve.dial(self.sock, client.curve.broker)
        self.sock.setsockopt(zmq.RCVTIMEO, _SLICE_MS)  # a blocking recv, woken every slice
        # a send blocks only while the queue to a broker long away is full: not forever
        self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(client.timeout * 1000)))
        self.sock.setsockopt(zmq.ROUTING_ID, driver_routing_id(client.driver))
        self.sock.connect(client.address)
        self._client = client
        with client._sockets_lock:
            client._sockets.add(self)

    def close(self) -> None:
        with self._client._sockets_lock:
            self._client._sockets.discard(self)
        if not self.sock.closed:
            self.sock.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown nothing is left to clean
            self.close()


class BrokerCalls:
    """Requests and their answers on each calling thread's own socket (the client's base)."""

    address: str
    ctx: zmq.Context[Any]
    curve: Curve | None
    driver: str
    timeout: float
    safe: bool  # decode answers in the safe value format (the client's ``trusted``)
    watch: BrokerWatch
    progress: ProgressBoard

    def __init__(self) -> None:
        # the broker's largest frame, as its last SessionOpened announced it (taken for at
        # least MIN_MAX_MESSAGE): a bigger message is refused here, before it is sent
        self.max_message = MAX_MESSAGE
        self._local = threading.local()
        self._sockets: set[ThreadSocket] = set()
        self._sockets_lock = threading.Lock()
        self._closed = False

    # -- sockets --------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket[Any]:
        if self._closed:
            raise MplError("the client is closed")
        holder: ThreadSocket | None = getattr(self._local, "socket", None)
        if holder is None or holder.sock.closed:
            holder = self._local.socket = ThreadSocket(self)
        return holder.sock

    def _drop_thread_socket(self) -> None:
        """Close the calling thread's DEALER (a thread about to end calls it)."""
        holder: ThreadSocket | None = getattr(self._local, "socket", None)
        if holder is not None:
            self._local.socket = None
            holder.close()

    def _close_sockets(self) -> None:
        with self._sockets_lock:
            sockets = list(self._sockets)
        for s in sockets:
            s.close()

    def _oversized(self, wire: list[Any], what: str) -> MessageTooLargeError | None:
        """The error for ``wire`` (a message as sent) if a frame of it is over the broker's
        limit: the broker's socket would drop it with the connection, and the caller wait
        out its deadline."""
        size = first_oversized(wire, self.max_message)
        if not size:
            return None
        return too_large(what, size, self.max_message, "the broker")

    # -- requests -------------------------------------------------------------------------
    def _send(self, msg: Record) -> None:
        """Send without an answer to wait for; dropped (and logged) if the queue to the
        broker stays full for ``timeout``: a delete or close is then left to the session's
        end or lease, a program is sent again when the broker asks for it. Raises
        ``MessageTooLargeError`` for one the broker would not take (a program whose
        functions captured a large value, say)."""
        wire = to_wire(encode(msg))
        if (oversized := self._oversized(wire, f"a {msg.TAG!r} message")) is not None:
            raise oversized
        try:
            send_frames(self._socket(), wire, 0)  # blocks at most SNDTIMEO
        except zmq.Again:
            log.warning("the broker at %s takes no messages: dropped a %s", self.address, msg.TAG)

    def _reply(self, msg: Record, req: int, timeout: float | None, what: str) -> Any:
        reply = self._call(msg, lambda m: isinstance(m, Reply) and m.req == req, timeout, what)
        assert isinstance(reply, Reply)
        if reply.error is not None:
            raise from_info(reply.error)
        return reply.value

    def _call(
        self, msg: Record, match: Callable[[Record], bool], timeout: float | None, what: str
    ) -> Record:
        """Send ``msg`` and wait on this thread's socket for the answer ``match`` accepts."""
        limit = self.timeout if timeout is None else max(0.0, timeout)
        sock = self._socket()
        try:
            send_frames(sock, to_wire(encode(msg)), 0)  # blocks at most SNDTIMEO
        except zmq.Again:
            raise MplTimeoutError(
                f"{what}: the broker at {self.address} took no message for {self.timeout:g} s "
                "(the queue to it is full)"
            ) from None
        session = getattr(msg, "session", None)
        deadline = time.monotonic() + limit
        return self._wait(sock, session, what, deadline, limit, limit, self._answers, match)

    def _job_call(self, msg: Exec, deadline: float, limit: float, grace: float) -> JobResult:
        """``_call`` for a job: send its Exec, wait on this thread's socket for its JobResult.

        Only the packing is done before the send; the progress board, the watch's verdicts
        and the answer's reading come after it, while the broker and workers run the job.
        ``deadline`` is ``limit`` and ``grace`` seconds from now.
        """
        sock = self._socket()
        job = msg.job
        wire = to_wire(exec_frames(msg))
        # one frame (most Execs) under the limit: no call; else the frames are looked at
        if (len(wire) != 1 or len(wire[0]) > self.max_message) and (
            oversized := self._oversized(wire, f"the Exec of job {job}")
        ) is not None:
            raise oversized
        try:
            send_frames(sock, wire, 0)  # blocks at most SNDTIMEO
        except zmq.Again:
            raise MplTimeoutError(
                f"job {job}: the broker at {self.address} took no message for "
                f"{self.timeout:g} s (the queue to it is full)"
            ) from None
        self.progress.begin(job)  # ended when its JobResult arrives
        what = f"job {job}"
        left = limit + grace
        result = self._wait(sock, msg.session, what, deadline, limit, left, self._mine, job, job)
        assert type(result) is JobResult
        return result

    def _wait(
        self,
        sock: zmq.Socket[Any],
        session: str | None,
        what: str,
        deadline: float,
        limit: float,
        left: float,
        read: Callable[[list[Any], _Key], Record | None],
        key: _Key,
        job: str | None = None,
    ) -> Record:
        """Wait on ``sock`` until ``read(frames, key)`` finds the answer in what arrived
        (``job``: the job waited for, if it is one, for its progress bar).

        ``left`` is the time to ``deadline`` now (``limit``, the caller's time limit, plus
        any grace): only the slice before the deadline is shortened, and a call without time
        left fails before it waits. A silent, restarted or refusing broker fails the wait at
        once (the watch's verdict for ``session``); ``what`` names the call in errors.
        """
        watch = self.watch
        short = False  # RCVTIMEO lowered for the last slice before the deadline
        try:
            while True:
                if left * 1000 < _SLICE_MS:
                    if left <= 0:
                        raise MplTimeoutError(
                            f"{what}: no answer from the broker at {self.address} "
                            f"within {limit:g} s"
                        )
                    sock.setsockopt(zmq.RCVTIMEO, int(left * 1000) + 1)
                    short = True
                if watch.refused is not None or watch.silence is not None or watch.lost:
                    trouble = watch.trouble(session, what)
                    if trouble is not None:
                        raise trouble
                try:
                    frames = from_wire(recv_frames(sock))
                except zmq.Again:
                    if job is not None:  # its bar, once it runs long enough
                        self.progress.tick(job)
                else:
                    answer = read(frames, key)
                    if answer is not None:
                        return answer
                # a slice passed, or an answer to something else came: the deadline is near?
                left = deadline - time.monotonic()
        finally:
            if short:
                sock.setsockopt(zmq.RCVTIMEO, _SLICE_MS)

    # -- answers --------------------------------------------------------------------------
    def _mine(self, frames: list[Any], job: str) -> Record | None:
        """The JobResult of ``job`` if ``frames`` is it (ended on the progress board), read
        on the lean path; anything else is read and acted on as :meth:`_answers` does."""
        try:
            answer = read_answer(frames, safe=self.safe)
        except ProtocolError as exc:  # a batch (not a message's magic), or refused

            def ours(m: Record) -> bool:
                return type(m) is JobResult and m.job == job

            if is_batch(frames):
                return self._answers(frames, ours)
            if refused_answer_job(frames) == job:  # its answer came, and cannot be taken
                self.progress.end(job, False)
                log.warning("bad message from the broker: %s", one_line(exc))
                raise ProtocolError(f"job {job}: the answer could not be accepted: {exc}") from None
            # refused: never read again (in a trusted cluster its pickles may have loaded
            # before the refusal, and a second read would run their code again)
            self._refused(frames, ours, exc)
            return None
        if type(answer) is JobResult and answer.job == job:
            if not answer.missing_program:
                self.progress.end(job, answer.error is None)
            return answer
        return self._take(answer, _never)  # not ours: a report, or a late answer

    def _answers(self, frames: list[Any], match: Callable[[Record], bool]) -> Record | None:
        """:meth:`_answer` for one ZeroMQ message, which may be a batch of answers
        (``mpl.wire.batch``): each is read as if it had come alone, in order."""
        if not is_batch(frames):
            return self._answer(frames, match)
        try:
            inner = split_batch(frames)
        except ProtocolError as exc:
            log.warning("bad message from the broker: %s", one_line(exc))
            return None
        found: Record | None = None
        for one in inner:
            answer = self._answer(one, match)
            if found is None:
                found = answer
        return found

    def _answer(self, frames: list[Any], match: Callable[[Record], bool]) -> Record | None:
        """The awaited answer among what arrived, or None for a stale message."""
        try:
            answer = read_answer(frames, safe=self.safe)
        except ProtocolError as exc:
            self._refused(frames, match, exc)
            return None
        return self._take(answer, match)

    def _refused(
        self, frames: list[Any], match: Callable[[Record], bool], exc: ProtocolError
    ) -> None:
        """A message ``read_answer`` refused with ``exc``: fails the call if it was its
        answer (:meth:`_refuse_answer`), else is logged and dropped."""
        if frames and foreign_version(frames[0]) is not None:
            raise exc  # a broker of another wire version: nothing it says can be read
        self._refuse_answer(frames, match, exc)
        log.warning("bad message from the broker: %s", one_line(exc))

    def _take(self, answer: Record, match: Callable[[Record], bool]) -> Record | None:
        """Act on one answer: ``answer`` if it is the awaited one, else None."""
        if isinstance(answer, JobResult) and not answer.missing_program:
            self.progress.end(answer.job, answer.error is None)
        if match(answer):
            return answer
        if isinstance(answer, Progress):
            self.progress.update(answer)
            return None
        if isinstance(answer, Refused):
            raise from_info(answer.error)
        if isinstance(answer, Bye):
            raise SessionError(f"the broker at {self.address} shut down")
        return None  # a late answer to a call this thread gave up on

    @staticmethod
    def _refuse_answer(
        frames: list[Any], match: Callable[[Record], bool], exc: ProtocolError
    ) -> None:
        """Fail the call at once when its own answer carries what we refuse (a pickle from
        a worker, say), instead of waiting out the deadline for an answer that came."""
        try:
            opaque = decode(frames, unpickle=False)
        except ProtocolError:
            return
        if match(opaque):
            raise ProtocolError(f"the answer could not be accepted: {exc}") from None
