"""A closed connection's file descriptor, reused by the next one, never costs the new peer.

The broker maps each peer to the fd its first message came in on (``SRCFD``) so that the
monitor's EVENT_DISCONNECTED finds a killed worker in milliseconds. The monitor is read at
the timer tick, so a connection may close and a new one reuse its fd, and send, before the
broker has read the old one's DISCONNECTED. That event must end the old peer, never the new
one (a status probe closing just before a worker's result channel sends its first message
used to make the broker lose that rank: "rank 0 has no live worker (lost: its connection
closed)").
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from mpl.broker.daemon import Broker
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import encode, to_wire
from mpl.wire.control import WorkerHello
from mpl.wire.sessions import StatusRequest
from mpl.wire.sockets import recv_frames


def _dealer(ctx: zmq.Context[Any], address: str) -> zmq.Socket[Any]:
    sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def _take_one(broker: Broker) -> int:
    """Route the next message the broker's ROUTER gets (as one wake-up); its source fd."""
    assert broker.router.poll(10_000), "no message reached the broker"
    frames = recv_frames(broker.router)
    broker._route(frames)
    broker._flush()
    return int(frames[0].get(zmq.SRCFD))


def _event_waits(broker: Broker) -> None:
    """Wait until the monitor holds an event, without reading it."""
    assert broker.monitor is not None
    assert broker.monitor.poll(10_000), "the monitor's event did not come"


def test_a_reused_fd_does_not_end_the_peer_that_reused_it() -> None:
    broker = Broker(ClusterSpec.simple(2), "tcp://127.0.0.1:0")
    ctx: zmq.Context[Any] = zmq.Context()
    socks: list[zmq.Socket[Any]] = []
    try:
        reused = 0
        for attempt in range(20):  # Linux hands out the lowest free fd: reuse is the rule
            probe = _dealer(ctx, broker.address)
            socks.append(probe)
            probe.send_multipart(to_wire(encode(StatusRequest(attempt))))
            old_fd = _take_one(broker)
            broker._drain_monitor()  # the probe's ACCEPTED, read as a tick would
            probe.close(linger=0)
            _event_waits(broker)  # the probe's DISCONNECTED waits, unread
            worker = _dealer(ctx, broker.address)
            socks.append(worker)
            hello = WorkerHello(0, f"inc{attempt}", 100, "host", "tcp://127.0.0.1:9", "")
            worker.send_multipart(to_wire(encode(hello)))
            new_fd = _take_one(broker)
            broker._drain_monitor()  # the tick: DISCONNECTED(old fd), ACCEPTED(new fd)
            broker._flush()
            entry = broker.state.registry.by_rank.get(0)
            assert entry is not None, f"rank 0 was lost when fd {old_fd} closed"
            reused += new_fd == old_fd
            worker.close(linger=0)
            deadline = time.monotonic() + 10
            while broker.state.registry.by_rank.get(0) is not None:  # its own close ends it
                assert time.monotonic() < deadline, "the worker's own close went unnoticed"
                if broker.monitor is not None and broker.monitor.poll(20):
                    broker._drain_monitor()
                    broker._flush()
            if reused >= 3:
                break
        assert reused >= 3, "the kernel never reused an fd: the case was not exercised"
    finally:
        for s in socks:
            s.close(linger=0)
        broker.close()
        ctx.term()
