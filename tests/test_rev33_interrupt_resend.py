"""Review of R33-3 (w33-rev-red): a job whose wait was interrupted is never sent again.

R33-3 made Ctrl-C in a wait on a job's future send the broker a ``Cancel`` on the pump's
socket. But the pump sends a job a second time on two answers: ``missing_program`` (the
broker lacked its graph: the job was never created there, so the ``Cancel`` met no job and
was dropped) and, in secure mode, a worker's refusal of a stream it forgot. Answered so
after the ``Cancel``, the interrupted job went out again and ran to its end: the ``Cancel``
was spent. The broker here is a raw ROUTER, the pump the driver's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from helpers import nap_then, wait_until
from interrupts import interrupt_once_running, jobs_in_flight

import mpl.driver as mp
from mpl.broker.query import query_status
from mpl.driver import inflight
from mpl.driver.inflight import JobPump, Pending
from mpl.driver.job_future import JobFuture, interrupted
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Cancel, Exec, JobResult
from mpl.wire.limits import MAX_MESSAGE
from mpl.wire.sockets import send_frames

DIGEST = "d" * 64


class _Graph:
    digest = DIGEST


class _Progress:
    def end(self, job: str, ok: bool) -> None:
        pass

    def update(self, msg: Any) -> None:
        pass


class _Watch:
    silence = None
    lost: frozenset[str] = frozenset()


class _Client:
    """What the pump asks of its client: a socket of its own to a broker (the raw ROUTER)."""

    def __init__(self, ctx: zmq.Context[Any], address: str) -> None:
        self.ctx, self.address = ctx, address
        self.progress, self.watch = _Progress(), _Watch()
        self.seal = None
        self.safe = True
        self.max_message = MAX_MESSAGE  # the broker's, as SessionOpened announced it
        self._programs = {DIGEST}  # the program went already: each job is one Exec
        self._sock: zmq.Socket[Any] | None = None

    def _socket(self) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        self._sock = sock
        return sock

    def _drop_thread_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()


@pytest.fixture
def rig() -> Iterator[tuple[zmq.Socket[Any], JobPump]]:
    ctx: zmq.Context[Any] = zmq.Context()
    broker = ctx.socket(zmq.ROUTER)
    broker.setsockopt(zmq.LINGER, 0)
    port = broker.bind_to_random_port("tcp://127.0.0.1")
    pump = JobPump(_Client(ctx, f"tcp://127.0.0.1:{port}"))  # type: ignore[arg-type]
    try:
        yield broker, pump
    finally:
        pump.close("test over")
        broker.close()
        ctx.term()


def _receive(broker: zmq.Socket[Any]) -> tuple[bytes, Any]:
    assert broker.poll(10_000), "nothing reached the broker"
    peer, *wired = broker.recv_multipart()
    try:
        return peer, decode(from_wire(wired), unpickle=False)
    except ProtocolError:  # a Program carrying the stub graph: only a resend sends one
        return peer, "a Program (the job's graph, sent again with its Exec)"


def test_an_interrupted_job_answered_missing_program_is_not_sent_again(
    rig: tuple[zmq.Socket[Any], JobPump],
) -> None:
    broker, pump = rig
    future = JobFuture(pump.interrupt)
    job = Exec("s~x", "j" * 24, DIGEST, (0, 1), {}, (), 60.0)
    pending = Pending(job, _Graph(), time.monotonic() + 60, 60.0, future, lambda r: r)  # type: ignore[arg-type]
    pump.put(pending)
    peer, first = _receive(broker)
    assert type(first) is Exec
    interrupted([future])  # Ctrl-C in a wait on it
    _, cancel = _receive(broker)
    assert type(cancel) is Cancel and cancel.job == job.job
    # the broker had no graph: it made no job, and the Cancel found none to stop
    answer = JobResult(job.job, missing_program=True)
    broker.send_multipart([peer, *to_wire(encode(answer))])
    # the pump either sends the job again (it would run to its end) or fails its future
    deadline = time.monotonic() + 10
    while not future.done() and time.monotonic() < deadline:
        if broker.poll(20):
            _, again = _receive(broker)
            pytest.fail(f"the interrupted job was sent again: {again!r}")
    assert future.done(), "the interrupted job's future never settled"
    assert isinstance(future.exception(), Exception)
    assert not broker.poll(0)


# -- the compiled call site -----------------------------------------------------------------
@pytest.mark.daemons
def test_ctrl_c_in_a_repeated_call_cancels_its_job(make_cluster: Callable[..., Any]) -> None:
    """A function's second call goes by its compiled call site (``mpl.driver.job_site``),
    which waits on its own: Ctrl-C there raised ``KeyboardInterrupt`` but sent no Cancel,
    so the job ran on (here a minute) holding its ranks, as R33-3 found for futures."""
    cluster = make_cluster("tcp")

    @mp.function  # rank 1 waits for rank 0's value, ``seconds`` in the making
    def slow(seconds: float) -> Any:
        return mp.device("P1")(int)(mp.device("P0")(nap_then)(1, seconds))

    ctx = mp.connect(cluster.address)
    try:
        with ctx:
            assert mp.fetch(slow(0.0)) == 1  # the first call sends the program
            interrupter = interrupt_once_running(cluster.address)
            with pytest.raises(KeyboardInterrupt):
                slow(60.0)  # the call site's own wait
            interrupter.join(30)
            wait_until(
                lambda: jobs_in_flight(cluster.address) == 0, 10, "the broker to drop the job"
            )
            assert query_status(cluster.address, timeout=5)["jobs_failed"] == 1  # cancelled
            assert mp.fetch(mp.device("P1")(int)(2)) == 2  # the session goes on
    finally:
        ctx.close()


@pytest.mark.daemons
def test_ctrl_c_in_a_futures_exception_wait_cancels_its_job(
    make_cluster: Callable[..., Any],
) -> None:
    """``Future.exception()`` waits as ``result()`` does (R33-3 covered ``result``, ``mp.wait``
    and ``mp.as_completed``): Ctrl-C there left the job running."""
    cluster = make_cluster("tcp")

    @mp.function
    def slow() -> Any:
        return mp.device("P1")(int)(mp.device("P0")(nap_then)(1, 60.0))

    ctx = mp.connect(cluster.address)
    try:
        with ctx:
            future = mp.submit(slow)
            interrupter = interrupt_once_running(cluster.address)
            with pytest.raises(KeyboardInterrupt):
                future.exception()
            interrupter.join(30)
            wait_until(
                lambda: jobs_in_flight(cluster.address) == 0, 10, "the broker to drop the job"
            )
            assert isinstance(future.exception(timeout=30), mp.MplError)
    finally:
        ctx.close()


def test_an_interrupted_jobs_cancel_waits_for_room_rather_than_being_dropped(
    rig: tuple[zmq.Socket[Any], JobPump], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Cancel goes on the pump's socket, behind the Execs it sent: when that socket's
    queue was full (``zmq.Again``), the Cancel was dropped, and the job ran on. Here the
    first Cancel meets a full queue, as a broker slow to read makes it."""
    broker, pump = rig
    sends = send_frames
    full = [True]

    def first_cancel_meets_a_full_queue(sock: Any, frames: Any, *args: Any) -> None:
        if full[0] and bytes(frames[0])[4:].startswith(_CANCEL_HEAD):
            full[0] = False
            raise zmq.Again()
        sends(sock, frames, *args)

    monkeypatch.setattr(inflight, "send_frames", first_cancel_meets_a_full_queue)  # the pump's
    future = JobFuture(pump.interrupt)
    job = Exec("s~x", "k" * 24, DIGEST, (0, 1), {}, (), 60.0)
    pump.put(Pending(job, _Graph(), time.monotonic() + 60, 60.0, future, lambda r: r))  # type: ignore[arg-type]
    assert type(_receive(broker)[1]) is Exec
    interrupted([future])  # Ctrl-C in a wait on it
    _, cancel = _receive(broker)
    assert not full[0], "the Cancel never met the full queue"
    assert type(cancel) is Cancel and cancel.job == job.job


_CANCEL_HEAD = bytes([0x90 | 4]) + b"\xa6cancel"  # a Cancel's header: [tag, 3 fields]
