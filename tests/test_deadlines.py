"""Waits that end: SPU sends to a member that stopped reading, a worker joining a broker
whose queue is full, and a driver's jobs in flight when the broker restarts."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from helpers import nap_then, stats, wait_until

from mpl.wire import GraphBuilder, SessionError
from mpl.wire.control import PeerInfo
from mpl.wire.errors import JobAbortedError, MplTimeoutError
from mpl.worker.spu_link import SpuLinks

JOB = ("s1", "j1")
LANE = "s1/SP0/x/0"
_HWM = 10_000  # mpl.wire.sockets: a PUSH queues this many messages, then refuses


def _unused_address() -> str:
    """A loopback port nobody listens on: a PUSH connected there queues until its HWM."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


_STOPPED: dict[tuple[str, str], str] = {}


@pytest.fixture
def links() -> Iterator[SpuLinks]:
    _STOPPED.clear()
    ctx: zmq.Context[Any] = zmq.Context()
    dead = PeerInfo(1, "gone", "", _unused_address())
    made = SpuLinks(ctx, "tcp://127.0.0.1:0", 0, lambda: {1: dead}, job_stopped=_STOPPED.get)
    made.open_lane(LANE)
    yield made
    made.close()
    ctx.term()


def _fill(links: SpuLinks, deadline: float, sent: list[int] | None = None) -> None:
    """Send to the dead member until a send raises, counting the sends in ``sent``."""
    sent = [0] if sent is None else sent
    while True:
        links.send(1, LANE, f"k{sent[0]}", b"x", JOB, deadline)
        sent[0] += 1


def test_an_spu_send_to_a_member_that_stopped_reading_ends_at_the_deadline(
    links: SpuLinks,
) -> None:
    deadline = time.monotonic() + 1.0
    sent = [0]
    with pytest.raises(MplTimeoutError, match="did not take SPU message"):
        _fill(links, deadline, sent)  # before, the send after the queue filled blocked forever
    # the send that found the queue full waited for the deadline, and gave up at it: not
    # before, and not at some later time of its own (a retry every 5 ms asks the clock)
    assert sent[0] >= _HWM
    assert deadline <= time.monotonic() < deadline + 10


def test_an_abort_releases_an_spu_send_stuck_on_a_full_queue(links: SpuLinks) -> None:
    errors: list[BaseException] = []
    sent = [0]

    def run() -> None:
        try:
            _fill(links, time.monotonic() + 60, sent)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(lambda: sent[0] >= _HWM, what="the member's queue to fill")
    _STOPPED[JOB] = "rank 1 was lost"  # what the worker's state says of the job
    links.wake()
    t.join(30)  # the send's own deadline is 60 s away: what ends it sooner is the abort
    assert not t.is_alive() and sent[0] >= _HWM
    assert isinstance(errors[0], JobAbortedError) and "rank 1 was lost" in str(errors[0])


def test_a_dropped_lane_releases_an_spu_send(links: SpuLinks) -> None:
    links.drop_lane(LANE)
    with pytest.raises(JobAbortedError, match="was dropped"):
        _fill(links, time.monotonic() + 60)


@pytest.mark.daemons
def test_futures_in_flight_fail_soon_after_the_broker_restarts(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=(1, 30.0))[0]
    futures = [client.submit_async(sid, b.build([x]), {}, timeout=60) for _ in range(3)]
    # the jobs reached the old broker: only the driver can tell they will never be answered
    wait_until(lambda: stats(client, 0).get("jobs_running") == 1, what="rank 0 to run a job")
    cluster.impl.kill_broker()
    cluster.impl.start_broker()
    cluster.impl.wait_ready()  # polled; what this test times is the futures, below
    back = time.monotonic()
    for f in futures:
        # the driver learns of the restart on its next heartbeat (1 s), then fails at once;
        # before, these waited for their 60 s deadline
        exc = f.exception(timeout=client.heartbeat_s + 3)
        assert isinstance(exc, SessionError) and "lost session" in str(exc)
    assert time.monotonic() - back < client.heartbeat_s + 1.5


def test_joining_with_a_full_result_queue_does_not_block_the_io_thread() -> None:
    from mpl.wire.control import Heartbeat
    from mpl.worker.daemon import Worker
    from mpl.worker.state_events import Joined

    ctx: zmq.Context[Any] = zmq.Context()
    worker = Worker(_unused_address(), 0, context=ctx)  # a broker that is not there (yet)
    try:
        for _ in range(_HWM + 10):  # results pile up while the broker is away; extras drop
            worker._post(Heartbeat(rank=0))
        done = threading.Event()

        def join() -> None:
            worker._perform([Joined("b1", new_broker=True)])
            done.set()

        threading.Thread(target=join, daemon=True).start()
        assert done.wait(10), "announcing the result channel blocked the I/O thread"
        assert worker._channel_owed  # sent later, once the queue drains
        assert worker.joined.is_set()
    finally:
        worker.close()
        ctx.term()


def test_the_job_pump_never_blocks_on_a_full_queue() -> None:
    from mpl.driver.client import Client

    client = Client(_unused_address(), heartbeat_s=0.2)  # a broker that never answers
    try:
        b = GraphBuilder(2)
        b.op("constant", [], ranks=(0,), value=1)
        graph = b.build([])
        # more than the socket queues: before, the pump blocked on the next send and the
        # futures after it were never settled, not even at their deadline
        futures = [client.submit_async("s", graph, {}, timeout=0.5) for _ in range(_HWM + 50)]
        for f in (futures[0], futures[-1]):
            assert isinstance(f.exception(timeout=10), MplTimeoutError)
    finally:
        client.close()


def test_a_call_fails_in_time_when_the_queue_to_the_broker_is_full() -> None:
    from mpl.driver.client import Client

    client = Client(_unused_address(), timeout=1.0)  # a broker that never answers
    try:
        sock = client._socket()  # this thread's socket: fill its queue to the broker
        while True:
            try:
                sock.send(b"queued", zmq.NOBLOCK)
            except zmq.Again:
                break
        started = time.monotonic()
        # before, the send of this request blocked forever
        with pytest.raises(MplTimeoutError, match="took no message"):
            client.status()
        assert time.monotonic() - started < 3
        client.close_session("s")  # a message with no answer: dropped, not blocking
    finally:
        client.close()
