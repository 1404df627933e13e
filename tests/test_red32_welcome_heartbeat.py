"""Third red team w32, finding R32-5: one Welcome from a hostile broker stopped a worker.

A worker takes its heartbeat interval from the broker's ``Welcome``. Any float went: NaN,
infinity or 1e300 made the I/O loop's next wait a NaN or an integer too large for
``zmq_poll`` (ValueError or OverflowError outside every guard), and the I/O thread died at
its next rest: the worker served nothing more, and no later Welcome could help. Zero or a
negative interval had the worker give up on the broker at every turn. A broker may deny
service, but a daemon must never crash on bad input (ARCHITECTURE §6). Now an interval
outside [``MIN_HEARTBEAT_S``, ``MAX_HEARTBEAT_S``] is refused: the worker keeps its own, and
counts a protocol error.

A real worker against a raw ROUTER playing the broker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from test_worker_loop import FakeBroker

from mpl.wire.control import Directory, Heartbeat
from mpl.worker.daemon import Worker


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.mark.parametrize("heartbeat_s", [float("nan"), float("inf"), 1e300, 0.0, -1.0])
def test_a_brokers_absurd_heartbeat_neither_stops_nor_unsettles_a_worker(
    ctx: zmq.Context[Any], heartbeat_s: float
) -> None:
    broker = FakeBroker(ctx)
    worker = Worker(broker.address, 0, context=ctx, heartbeat_s=0.5).start()
    try:
        broker.welcome(heartbeat_s)
        assert worker.joined.wait(10), "the worker did not join the fake broker"
        # it keeps serving: heartbeats go out, and it answers the broker as before
        deadline = time.monotonic() + 20
        while broker.beats() < 3:
            assert time.monotonic() < deadline, "no heartbeats from the worker"
            broker.send(Directory({}))  # the broker keeps talking: the worker stays joined
            broker.pump(100)
        assert worker._thread is not None and worker._thread.is_alive()
        assert worker.state.joined
        assert sum(isinstance(m, Heartbeat) for m in broker.heard) >= 3
        assert worker.state.heartbeat_s == 0.5  # its own, kept
        assert worker.stats()["protocol_errors"] == 1  # the Welcome's interval, counted
    finally:
        worker.stop()
        worker.join(10)
        broker.router.close(linger=0)
