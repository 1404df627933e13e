"""Socket options every part applies, and the send/receive helpers around the codec.

Every socket gets a bounded LINGER (so ``Context.term()`` never hangs) and bounded
high-water marks; ROUTER sockets get ROUTER_MANDATORY so an unroutable send raises instead
of vanishing. Whatever a peer can reach is bounded too: no frame above ``max_message``
(MAXMSGSIZE; a bigger one drops the connection, it is never buffered) and no CURVE
handshake that takes longer than HANDSHAKE_IVL. Frames are sent with ``copy=False``: pyzmq
still copies those under its 64 KiB threshold and hands larger ones to libzmq without a copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import zmq

from mpl.wire.codec import decode, encode, frames_nbytes
from mpl.wire.record import Record

__all__ = [
    "CONTROL_MAX_MESSAGE",
    "HANDSHAKE_IVL_MS",
    "LINGER_MS",
    "MAX_MESSAGE",
    "configure",
    "drain",
    "recv_message",
    "send_message",
]

LINGER_MS = 200
# Frames on sockets that carry values (jobs, fetches, moves, SPU shares) may be this big;
# `--max-message` changes it. Sockets that carry only control (heartbeats, status) take less.
MAX_MESSAGE = 4 << 30
CONTROL_MAX_MESSAGE = 4 << 20
HANDSHAKE_IVL_MS = 5_000  # libzmq's default is 30 s: a stalled handshake holds a slot that long
_HWM = 10_000
_POLLIN = int(zmq.POLLIN)  # a plain int: `int & IntFlag` would build an enum each time


def configure(
    sock: zmq.Socket[Any], *, linger_ms: int = LINGER_MS, max_message: int = MAX_MESSAGE
) -> zmq.Socket[Any]:
    """Apply mpl's standard options to a new socket and return it."""
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
    sock.setsockopt(zmq.SNDHWM, _HWM)
    sock.setsockopt(zmq.RCVHWM, _HWM)
    if sock.type == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if sock.type in (zmq.ROUTER, zmq.DEALER, zmq.PUSH, zmq.PULL):
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    return sock


def drain(sock: zmq.Socket[Any], limit: int = 256) -> Iterator[list[zmq.Frame]]:
    """Yield the messages waiting on ``sock`` (at most ``limit``) without blocking.

    Checks ZMQ_EVENTS between receives instead of ending on ``zmq.Again``: building that
    exception costs more than the check.
    """
    for i in range(limit):
        if i and not int(sock.getsockopt(zmq.EVENTS)) & _POLLIN:
            return
        try:
            yield sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return


def send_message(
    sock: zmq.Socket[Any], msg: Record, envelope: Sequence[Any] = (), flags: int = 0
) -> int:
    """Encode and send ``msg`` behind ``envelope``; returns the bytes sent."""
    frames = encode(msg)
    sock.send_multipart([*envelope, *frames], flags=flags, copy=False)
    return frames_nbytes(frames)


def recv_message(sock: zmq.Socket[Any], *, unpickle: bool = True, safe: bool = True) -> Record:
    """Receive and decode one message without an envelope (DEALER, PULL, PAIR); in the safe
    value format unless ``safe=False`` (see ``mpl.wire.safe_values``)."""
    return decode(sock.recv_multipart(copy=False), unpickle=unpickle, safe=safe)
