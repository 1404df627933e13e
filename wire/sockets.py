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

from mpl.wire.codec import decode, encode, frames_nbytes, from_wire, to_wire
from mpl.wire.errors import MessageTooLargeError
from mpl.wire.limits import MAX_MESSAGE, MIN_MAX_MESSAGE
from mpl.wire.record import Record

__all__ = [
    "CONTROL_MAX_MESSAGE",
    "HANDSHAKE_IVL_MS",
    "LINGER_MS",
    "MAX_MESSAGE",
    "MIN_MAX_MESSAGE",
    "announced_limit",
    "configure",
    "drain",
    "encoded_oversized",
    "first_oversized",
    "least_encoded_bytes",
    "poll_in",
    "recv_frames",
    "recv_message",
    "recv_queued",
    "send_frames",
    "send_message",
    "too_large",
]

LINGER_MS = 200
# Frames on sockets that carry values (jobs, fetches, moves, SPU shares) may be this big;
# `--max-message` changes it. Sockets that carry only control (heartbeats, status) take less.
# (MAX_MESSAGE and MIN_MAX_MESSAGE live in mpl.wire.limits: records default to them)
CONTROL_MAX_MESSAGE = 4 << 20
HANDSHAKE_IVL_MS = 5_000  # libzmq's default is 30 s: a stalled handshake holds a slot that long
_HWM = 10_000
_POLLIN = int(zmq.POLLIN)  # a plain int: `int & IntFlag` would build an enum each time
NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE)
_COPY_BELOW = 64 * 1024  # pyzmq's copy threshold: smaller frames are copied, not tracked
# The hot path calls the compiled socket methods directly: pyzmq's Python layer around them
# (send_multipart, recv_multipart) costs more per message than the send or receive itself,
# mostly by combining IntFlag enums. Same semantics, same exceptions. An object that only
# looks like a socket (a test's wrapper that watches the traffic) gets the pyzmq calls.
_raw_send = zmq.backend.Socket.send
_raw_recv = zmq.backend.Socket.recv
_raw_get = zmq.backend.Socket.get
_zmq_poll = zmq.zmq_poll
_EVENTS = int(zmq.EVENTS)
assert issubclass(zmq.Socket, zmq.backend.Socket)


_Backend: Any = zmq.backend.Socket  # Any: a test may hand in a look-alike


def _compiled(sock: object) -> bool:
    return isinstance(sock, _Backend)


def announced_limit(value: int) -> int:
    """The frame limit a peer announced (its ``--max-message``: the broker's in
    ``SessionOpened`` and ``Welcome``) as this side holds itself to it: never under
    :data:`MIN_MAX_MESSAGE`. It is the peer's word, only ever used to refuse a message before
    sending it (which that peer would drop with its connection): a hostile peer's figure
    makes this side refuse what it would drop anyway, never allocate or wait."""
    return value if value >= MIN_MAX_MESSAGE else MIN_MAX_MESSAGE


def first_oversized(frames: Sequence[Any], limit: int) -> int:
    """The size of the first of ``frames`` (as sent: ``to_wire``'s) over ``limit`` bytes,
    else 0. libzmq's MAXMSGSIZE bounds each frame, not their sum."""
    for frame in frames:
        size = len(frame) if type(frame) is bytes else memoryview(frame).nbytes
        if size > limit:
            return size
    return 0


def encoded_oversized(frames: Sequence[Any], limit: int) -> int:
    """:func:`first_oversized` for a message in the codec's form (``[magic, header,
    *buffers]``: the magic and the header go as one frame)."""
    head = len(frames[0]) + memoryview(frames[1]).nbytes
    if head > limit:
        return head
    return first_oversized(frames[2:], limit) if len(frames) > 2 else 0


def least_encoded_bytes(value: Any) -> int:
    """A lower bound of ``value``'s encoded size, in constant time (nothing is walked): its
    length for bytes and strings, its bytes for an array, one byte an item for a list,
    tuple, set or dict (msgpack's least); 0 for anything else. Enough to refuse a value
    far over a limit before encoding it, and to keep a long container off the worker's
    I/O thread (encoding a Python list costs per item: seconds for millions)."""
    if isinstance(value, (bytes, bytearray, str, list, tuple, set, frozenset, dict)):
        return len(value)
    nbytes = getattr(value, "nbytes", None)  # an array, a memoryview
    return nbytes if type(nbytes) is int else 0


def too_large(
    what: str, size: int, limit: int, whose: str, *, at_least: bool = False
) -> MessageTooLargeError:
    """The error for a message refused before sending: ``what`` (an Exec of job X, the
    result of job X on rank N) has a frame of ``size`` bytes (``at_least``: estimated
    before encoding), over ``whose`` (the broker's, rank N's) limit."""
    frame = f"at least {size:,} bytes encoded" if at_least else f"a frame of {size:,} bytes"
    return MessageTooLargeError(
        f"{what} is too large to send: {frame}, over the {limit:,}-byte "
        f"limit of {whose} (--max-message). Raise --max-message on the broker and every "
        "worker, or move the data as files the parties read themselves (mpl.io)",
        size=size,
        limit=limit,
    )


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


def drain(
    sock: zmq.Socket[Any], limit: int = 256, *, look_first: bool = False
) -> Iterator[list[zmq.Frame]]:
    """Yield the messages waiting on ``sock`` (at most ``limit``) without blocking.

    Looks whether a message waits between receives instead of ending on ``zmq.Again``:
    building that exception costs more than the look (~25k instructions: pyzmq adds its
    compiled frames to the traceback). ``look_first``: before the first receive too, for
    a caller that most often finds nothing (the broker's timers).

    The look is a ``zmq_poll`` with no wait on a list built once per call: libzmq reads
    ZMQ_EVENTS for it (pending commands processed first, so a message that has arrived is
    seen), as ``Socket.get(EVENTS)`` would, without the option enum pyzmq looks up on every
    ``get``: about 3k instructions a look instead of 9k (scripts/bench_socket_look.py), for
    one more system call (a poll of the socket's fd). ZMQ_EVENTS read resets ZMQ_FD's edge,
    so a caller that waits on ZMQ_FD itself must drain until this ends on its own, not at
    ``limit``; ours wait in ``zmq_poll`` or in a receive, which read ZMQ_EVENTS again.
    """
    if isinstance(sock, _Backend) and not sock._closed:
        watched = [(sock, _POLLIN)]
        for i in range(limit):
            if (i or look_first) and not _zmq_poll(watched, 0):
                return
            try:
                yield recv_frames(sock, NOBLOCK)
            except zmq.Again:
                return
        return
    # a look-alike (a test's wrapper), or a closed socket: ZMQ_EVENTS read as an option,
    # which raises ENOTSOCK on a closed one (a poll would read the wrong fd)
    raw = _compiled(sock)
    for i in range(limit):
        if i or look_first:
            events = _raw_get(sock, _EVENTS) if raw else sock.getsockopt(_EVENTS)
            if not int(events) & _POLLIN:
                return
        try:
            yield recv_frames(sock, NOBLOCK)
        except zmq.Again:
            return


def recv_queued(sock: zmq.Socket[Any], limit: int) -> Iterator[list[zmq.Frame]]:
    """Yield the messages already queued on ``sock`` (at most ``limit``), ending at the
    first receive that finds none.

    For a loop that has just received one message and wants what else is there before it
    answers: a receive that finds a message queued costs no system call (libzmq looks at
    its command mailbox only every so many receives), where checking ZMQ_EVENTS first
    looks at it every time. Only the last, empty receive costs one, and a ``zmq.Again``.
    """
    raw = _compiled(sock)
    for _ in range(limit):
        try:
            if raw:
                frame = _raw_recv(sock, NOBLOCK, False)
            else:
                yield list(sock.recv_multipart(NOBLOCK, copy=False))
                continue
        except zmq.Again:
            return
        frames = [frame]
        while frame.more:
            frame = _raw_recv(sock, 0, False)
            frames.append(frame)
        yield frames


def poll_in(sock: zmq.Socket[Any], timeout_ms: int) -> bool:
    """Whether a message waits on ``sock`` within ``timeout_ms``: ``sock.poll`` without the
    Poller object it builds on every call."""
    if not _compiled(sock):
        return bool(sock.poll(timeout_ms, _POLLIN))
    return bool(zmq.zmq_poll([(sock, _POLLIN)], timeout_ms))


def recv_frames(sock: zmq.Socket[Any], flags: int = 0) -> list[zmq.Frame]:
    """One multipart message as ``zmq.Frame`` objects (no copy; wire frames: a codec
    message goes through ``from_wire`` after any envelope): ``recv_multipart(flags,
    copy=False)`` without its per-part overhead. Raises ``zmq.Again`` as it does."""
    if not isinstance(sock, _Backend):  # _compiled, without its call
        return list(sock.recv_multipart(flags, copy=False))
    frame = _raw_recv(sock, flags, False)
    frames = [frame]
    while frame.more:  # the rest of a multipart message is already there: never blocks
        frame = _raw_recv(sock, 0, False)
        frames.append(frame)
    return frames


def send_frames(sock: zmq.Socket[Any], frames: Sequence[Any], flags: int = NOBLOCK) -> None:
    """Send ``frames`` (wire frames: a codec message goes through ``to_wire`` first) as
    one multipart message: ``send_multipart(frames, flags,
    copy=False)`` without its per-part overhead. Small ``bytes`` frames are copied (cheaper
    than tracking them); everything else goes to libzmq as it is (zero-copy when large).

    ``flags`` goes with every part, as in ``send_multipart``; errors are the same
    (``zmq.Again`` on a full queue with NOBLOCK, EHOSTUNREACH from a mandatory ROUTER).
    """
    if not isinstance(sock, _Backend):  # _compiled, without its call
        sock.send_multipart(frames, flags, copy=False)
        return
    last = len(frames) - 1
    if last == 1:  # a header-only message (most): its two frames without the loop
        first, second = frames
        if type(first) is bytes and len(first) < _COPY_BELOW:
            _raw_send(sock, first, flags | _MORE)
        else:
            _raw_send(sock, first, flags | _MORE, False)
        if type(second) is bytes and len(second) < _COPY_BELOW:
            _raw_send(sock, second, flags)
        else:
            _raw_send(sock, second, flags, False)
        return
    for i, frame in enumerate(frames):
        more = _MORE if i < last else 0
        if type(frame) is bytes and len(frame) < _COPY_BELOW:
            _raw_send(sock, frame, flags | more)
        else:
            _raw_send(sock, frame, flags | more, False)


def send_message(
    sock: zmq.Socket[Any], msg: Record, envelope: Sequence[Any] = (), flags: int = 0
) -> int:
    """Encode and send ``msg`` behind ``envelope``; returns the bytes sent."""
    frames = encode(msg)
    send_frames(sock, [*envelope, *to_wire(frames)], flags)
    return frames_nbytes(frames)


def recv_message(sock: zmq.Socket[Any], *, unpickle: bool = True, safe: bool = True) -> Record:
    """Receive and decode one message without an envelope (DEALER, PULL, PAIR); in the safe
    value format unless ``safe=False`` (see ``mpl.wire.safe_values``)."""
    return decode(from_wire(recv_frames(sock)), unpickle=unpickle, safe=safe)
