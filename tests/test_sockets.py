"""The hot path's socket helpers (wire/sockets.py) behave like pyzmq's multipart calls."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from mpl.wire.sockets import NOBLOCK, configure, drain, poll_in, recv_frames, send_frames


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    ctx: zmq.Context[Any] = zmq.Context()
    a, b = configure(ctx.socket(zmq.PAIR)), configure(ctx.socket(zmq.PAIR))
    a.bind("inproc://sockets-test")
    b.connect("inproc://sockets-test")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()


def test_frames_arrive_whole_and_in_order(pair: tuple[zmq.Socket[Any], ...]) -> None:
    a, b = pair
    big = np.arange(100_000, dtype=np.float64)  # above the copy threshold: zero-copy
    # numpy's stubs give ndarray the buffer protocol from Python 3.12 only
    send_frames(a, [b"MPL\x01", b"header", memoryview(big), b""])  # type: ignore[arg-type]
    send_frames(a, [b"second"])
    assert poll_in(b, 1000)
    frames = recv_frames(b, NOBLOCK)
    assert [f.bytes for f in frames[:2]] == [b"MPL\x01", b"header"]
    assert np.array_equal(np.frombuffer(frames[2].buffer, dtype=np.float64), big)
    assert frames[3].bytes == b"" and len(frames) == 4
    assert [f.bytes for f in recv_frames(b)] == [b"second"]
    assert not poll_in(b, 0)
    with pytest.raises(zmq.Again):
        recv_frames(b, NOBLOCK)


def test_drain_takes_what_waits_and_stops(pair: tuple[zmq.Socket[Any], ...]) -> None:
    a, b = pair
    for i in range(5):
        send_frames(a, [b"m", str(i).encode()])
    assert poll_in(b, 1000)
    got = [f[1].bytes for f in drain(b, limit=3)]
    assert got == [b"0", b"1", b"2"]
    assert [f[1].bytes for f in drain(b)] == [b"3", b"4"]
    assert list(drain(b)) == []


def test_drain_looking_first_finds_what_arrives_over_tcp_and_never_blocks() -> None:
    """The look before the first receive (the broker's timers) sees a message that came
    over TCP since the last look, whose arrival libzmq learns from its command mailbox, and
    an empty look returns at once. Over a closed socket it raises, as reading ZMQ_EVENTS did."""
    ctx: zmq.Context[Any] = zmq.Context()
    a, b = configure(ctx.socket(zmq.DEALER)), configure(ctx.socket(zmq.DEALER))
    try:
        port = b.bind_to_random_port("tcp://127.0.0.1")
        a.connect(f"tcp://127.0.0.1:{port}")
        assert list(drain(b, look_first=True)) == []  # nothing yet: returns, no receive
        for round_ in range(3):
            sent = [str(round_ * 10 + i).encode() for i in range(4)]
            for body in sent:
                send_frames(a, [b"m", body])
            got: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(got) < len(sent) and time.monotonic() < deadline:
                got += [f[1].bytes for f in drain(b, look_first=True)]
            assert got == sent
            assert list(drain(b, look_first=True)) == []
        b.close(linger=0)
        with pytest.raises(zmq.ZMQError):
            list(drain(b, look_first=True))
        with pytest.raises(zmq.ZMQError):
            list(drain(b))
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def test_a_send_with_nowhere_to_go_raises_again_without_blocking() -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    push = configure(ctx.socket(zmq.PUSH))
    push.bind("inproc://sockets-full")  # nobody connects: no queue to put it in
    try:
        with pytest.raises(zmq.Again):
            send_frames(push, [b"a", b"b"])
    finally:
        push.close(linger=0)
        ctx.term()
