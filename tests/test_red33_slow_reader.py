"""Red team w33 (R33-1, open): a driver that stops reading pins the broker's memory.

A fetch's value travels worker -> broker -> driver, and the broker hands the reply to
libzmq the moment it arrives. A driver that keeps asking and never reads its socket (its
receive queue held at one message, its TCP window shut) leaves every reply in the broker's
queue to it: libzmq keeps up to ``SNDHWM`` (10,000) messages per connection, each up to
``--max-message`` (4 GiB), and a driver may open as many connections as it likes. The
broker's calls-in-flight bound does not help: each fetch is over, for the broker, once its
reply is queued. So one listed driver (in plaintext, any local process) grows the broker
shared by every session without bound: 96 fetches of a 1 MiB value below hold about 96 MiB
in the broker, for as long as the connection stays open.

What a fix needs (not small, so not made here): the broker must know how much it has
queued to a driver that the driver has not taken. libzmq does not say, so the driver would
have to acknowledge (credit-based flow control: at most N bytes of replies outstanding per
driver identity, replies past it held back or refused with a clear error), or large values
must reach the driver by a path whose sender sees the reader's pace (the worker's result
channel straight to the driver, or fetches in chunks the driver asks for one by one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import zmq
from helpers import make_array, wait_until

import mpl.driver as mp
from mpl.wire.codec import encode, to_wire
from mpl.wire.data import Fetch
from mpl.wire.routing import driver_routing_id

pytestmark = pytest.mark.daemons

FETCHES = 96
VALUE_BYTES = 1 << 20
GROWTH_LIMIT_MIB = 48  # half of what the unread replies take


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@pytest.mark.xfail(
    strict=True,
    reason="R33-1: the broker queues fetch replies to a driver that never reads, unbounded "
    "(libzmq's SNDHWM counts messages, not bytes); needs flow control, see the docstring",
)
def test_a_driver_that_never_reads_does_not_grow_the_broker(
    make_cluster: Callable[..., Any],
) -> None:
    cluster = make_cluster("tcp", world_size=1)
    broker = cluster.impl.broker.pid
    ctx = mp.connect(cluster.address)
    zctx: zmq.Context[Any] = zmq.Context()
    reader = zctx.socket(zmq.DEALER)
    try:
        with ctx:
            value = mp.device("P0")(make_array)(VALUE_BYTES // 8)
            mp.fetch(value)  # made, and the broker's first fetch buffers are warm
            before = _rss_mib(broker)
            # the same driver (plaintext: its declared name) on a socket of its own that reads
            # nothing: a one-message receive queue and a small kernel buffer
            reader.setsockopt(zmq.LINGER, 0)
            reader.setsockopt(zmq.RCVHWM, 1)
            reader.setsockopt(zmq.RCVBUF, 4096)
            reader.setsockopt(zmq.ROUTING_ID, driver_routing_id(ctx.client.driver))
            reader.connect(cluster.address)
            for req in range(FETCHES):
                fetch = Fetch(ctx.session, 1_000_000 + req, 0, value._uri)
                reader.send_multipart(to_wire(encode(fetch)))

            def grown() -> bool:
                return _rss_mib(broker) - before >= GROWTH_LIMIT_MIB

            # the attack has worked once the broker holds half the replies; on a fixed broker
            # this wait runs out and the assertion below holds
            with contextlib.suppress(AssertionError):
                wait_until(grown, 30, "the broker to hold the unread replies")
            assert _rss_mib(broker) - before < GROWTH_LIMIT_MIB
            # the broker still serves the driver's own calls meanwhile
            assert mp.fetch(mp.device("P0")(make_array)(4)).shape == (4,)
    finally:
        reader.close()
        zctx.term()
        ctx.close()
