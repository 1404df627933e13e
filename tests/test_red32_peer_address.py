"""Third red team w32: what a hostile broker can do with the peer directory (no finding).

Workers learn where their peers listen from the broker's ``Directory``, so a broker
operator can name any address for rank 1: the worker then opens a TCP connection there
(and sends ZeroMQ's greeting and a CURVE HELLO, which carries no long-term key). What it
cannot do is receive the move: each PUSH pins rank 1's key from the worker's own spec,
and only the holder of rank 1's secret key completes the handshake. This test keeps it
so: a listener with the broker's own key at the named address sees the handshake fail
and receives nothing, and the same move to the genuine rank 1 arrives.
"""

from __future__ import annotations

import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from mpl.wire import ClusterSpec
from mpl.wire.curve import Curve
from mpl.wire.keys import KeyPair
from mpl.wire.sockets import configure
from mpl.worker.push_pool import PushPool, send_until

_DEADLINE_S = 20.0


def _pair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public.decode("ascii"), secret.decode("ascii"))


def _listener(ctx: zmq.Context[Any], pair: KeyPair) -> tuple[zmq.Socket[Any], str]:
    pull = configure(ctx.socket(zmq.PULL), linger_ms=0)
    pull.setsockopt(zmq.CURVE_SERVER, 1)
    pull.setsockopt(zmq.CURVE_SECRETKEY, pair.secret.encode("ascii"))
    pull.setsockopt(zmq.CURVE_PUBLICKEY, pair.public.encode("ascii"))
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    return pull, f"tcp://127.0.0.1:{port}"


def _send(pool: PushPool, dst: int, addr: str, payload: bytes) -> zmq.Socket[Any]:
    link = pool.link(dst, addr)
    send_until(
        link, [payload], deadline=time.monotonic() + 5, retry_s=0.005,
        stopped=lambda: None, failure=lambda reason: AssertionError(reason),
    )  # fmt: skip
    return link.sock


def test_a_move_never_reaches_an_address_the_broker_names_for_a_peer(
    zmq_ctx: zmq.Context[Any],
) -> None:
    nodes, broker = [_pair(), _pair()], _pair()
    spec = ClusterSpec.simple(2).with_keys(
        broker.public, [p.public for p in nodes], {"analyst": _pair().public}
    )
    pool = PushPool(zmq_ctx, Curve(nodes[0], spec))
    fake, fake_addr = _listener(zmq_ctx, broker)  # the broker's own listener, its key
    real, real_addr = _listener(zmq_ctx, nodes[1])  # rank 1, holding its key
    try:
        sock = _send(pool, 1, fake_addr, b"rank 0's share for rank 1")
        monitor = sock.get_monitor_socket()
        failed = False
        deadline = time.monotonic() + _DEADLINE_S
        while not failed:  # the handshake with the wrong key fails (each retry again)
            assert time.monotonic() < deadline, "no handshake failure seen"
            if monitor.poll(100):
                event = recv_monitor_message(monitor)
                failed = event["event"] in (
                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                    zmq.EVENT_DISCONNECTED,
                )
        sock.disable_monitor()
        monitor.close(linger=0)
        assert fake.poll(0) == 0, "the broker's listener received rank 0's move"
        # the broker names the right address again: the same move reaches rank 1
        _send(pool, 1, real_addr, b"rank 0's share for rank 1")
        assert real.poll(int(_DEADLINE_S * 1000)), "rank 1 never got the move"
        assert real.recv() == b"rank 0's share for rank 1"
        assert fake.poll(0) == 0
    finally:
        pool.close()
        fake.close(linger=0)
        real.close(linger=0)
