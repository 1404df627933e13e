"""Several small messages to one peer as one ZeroMQ message: fewer sends and wake-ups.

With many jobs in flight, a sender often has several hot messages queued for the same peer
at once (the driver's Execs, the broker's Execs to a worker and JobResults to a driver, a
worker's Dones). Each costs a libzmq send, a receive and, often, a thread wake-up at the
other end. What is *already queued* for one peer goes out as one batch instead; nothing
waits for a batch to fill, so no latency is added.

The codec's form (``mpl.wire.codec``), what :func:`batch_frames` builds and
:func:`split_batch` reads, and its wire form (version 4: ``to_wire`` joins the two)::

    [0]   BATCH_MAGIC   b"MPB" + the codec's version byte (never a message's magic)
    [1]   a msgpack array of 1 to MAX_BATCH bins, one header each: the inner message is
          [MAGIC_FRAME, header]

so a batch is ONE frame on the wire, however many messages it carries: under CurveZMQ
every frame is a box to seal and open and a message part for libzmq. (Version 3 sent a
frame per header.)

Only header-only messages (no buffer frames) of less than ``BATCH_HEADER_BELOW`` bytes
ride in a batch; a sender sends anything else alone, in its place (the messages after it to
that peer go after it), so the order each peer sees never changes (:func:`coalesce`). A
receiver splits a batch with :func:`split_batch` (or takes its headers, as bytes, with
:func:`batch_headers`) and handles each inner message exactly as if it had arrived alone
from the same peer, with the same authenticated identity (the batch's frame carries the
connection's CURVE User-Id) and every check it gets alone.
Splitting runs no code and grows nothing beyond the frame: it checks the count (1 to
:data:`MAX_BATCH` inner messages; a batch of one is legal, an empty or larger one is
refused), then walks the array's items by their bin heads, by hand (msgpack is not asked to
read them: it would build whatever they are, arrays nested in arrays included, before a
check could refuse them), and slices each header out; then it pairs each header with the
codec's magic (so no inner message is a batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from mpl.wire.codec import MAGIC_FRAME, VERSION
from mpl.wire.errors import ProtocolError
from mpl.wire.limits import MAX_HEADER_BYTES
from mpl.wire.msgpack_bins import BIN8, bin_bounds

__all__ = [
    "BATCH_HEADER_BELOW",
    "BATCH_MAGIC",
    "MAX_BATCH",
    "batch_frames",
    "batch_headers",
    "coalesce",
    "header_only",
    "is_batch",
    "split_batch",
]

BATCH_MAGIC = b"MPB" + bytes([VERSION])
# Inner messages per batch: a sender never puts more in one, a receiver refuses more. It
# bounds what one receive makes a receiver do before its timers and other peers get a turn.
MAX_BATCH = 64
# A header this long or longer goes alone (zero-copy when large), not copied into a batch:
# a batch's frame stays under MAX_BATCH times this (4 MiB), well within MAX_HEADER_BYTES.
BATCH_HEADER_BELOW = 64 * 1024
_MAGIC_LEN = len(BATCH_MAGIC)
_FIXARRAY, _ARRAY16, _ARRAY32 = 0x90, 0xDC, 0xDD


def is_batch(frames: Sequence[Any]) -> bool:
    """Whether ``frames`` (one message, without a routing envelope) is a batch."""
    if not frames:
        return False
    first = frames[0]
    # len() of a received zmq.Frame is its size: only a 4-byte first frame is looked at
    return len(first) == _MAGIC_LEN and bytes(first) == BATCH_MAGIC


def split_batch(frames: Sequence[Any]) -> list[list[Any]]:
    """The inner messages of batch ``frames`` (the codec's form: the magic, then the array
    of headers), each ``[MAGIC_FRAME, header]`` as it would have arrived alone. Raises
    ProtocolError as :func:`batch_headers` does; the inner headers are not read here (the
    receiver decodes each as it would decode the message alone)."""
    return [[MAGIC_FRAME, header] for header in batch_headers(frames)]


def batch_headers(frames: Sequence[Any]) -> list[bytes]:
    """The inner headers of batch ``frames`` (the codec's form: the magic, then the array
    of headers), as bytes, each to be read as the header of a message of the codec's magic
    (:func:`split_batch` pairs them with it). Raises ProtocolError for anything but a
    magic and one frame holding a msgpack array of 1 to ``MAX_BATCH`` bins (nothing after
    it)."""
    if len(frames) != 2:
        raise ProtocolError(f"a batch is its magic and one frame, not {len(frames)} frames")
    body = frames[1]
    try:  # bytes as they are (from_wire's slice), else one copy (a large batch's view)
        data = body if type(body) is bytes else memoryview(body).tobytes()
    except TypeError:
        raise ProtocolError("a batch's frame is no buffer") from None
    size = len(data)
    if size > MAX_HEADER_BYTES:
        raise ProtocolError(f"a batch of {size} bytes exceeds {MAX_HEADER_BYTES}")
    mark = data[0] if size else -1
    if _FIXARRAY <= mark < _FIXARRAY + 16:  # the count, read before msgpack builds a thing
        count = mark - _FIXARRAY
    elif mark == _ARRAY16 and size >= 3:
        count = int.from_bytes(data[1:3], "big")
    elif mark == _ARRAY32 and size >= 5:
        count = int.from_bytes(data[1:5], "big")
    else:
        raise ProtocolError("a batch's frame holds no array of headers")
    if count < 1:
        raise ProtocolError("an empty batch")
    if count > MAX_BATCH:
        raise ProtocolError(f"a batch of {count} messages (at most {MAX_BATCH})")
    # Each item's bin head read by hand: msgpack would build whatever the items are
    # (arrays nested in arrays: a list per byte) before they could be checked. A bin8's
    # head (every header under 256 bytes: a trivial job's) is read here, without
    # bin_bounds's call; any other head is bin_bounds's to read or refuse.
    at = 1 if mark < _ARRAY16 else 3 if mark == _ARRAY16 else 5
    inner: list[bytes] = []
    for _ in range(count):
        if at + 2 <= size and data[at] == BIN8:
            start = at + 2
            stop = start + data[at + 1]
        else:
            bounds = bin_bounds(data, at)
            if bounds is None:
                raise ProtocolError("a batch holds something other than headers")
            start, stop = bounds
        if stop > size:
            raise ProtocolError(f"a batch's header of {stop - start} bytes, {size - start} there")
        inner.append(data[start:stop])
        at = stop
    if at != size:
        raise ProtocolError("a batch has bytes after its array of headers")
    return inner


def header_only(frames: Sequence[Any]) -> Any | None:
    """The header of an encoded message without buffer frames (one that may ride in a
    batch), or None."""
    if len(frames) == 2 and (frames[0] is MAGIC_FRAME or bytes(frames[0]) == MAGIC_FRAME):
        return frames[1]  # the identity check first: most frames are the codec's own
    return None


def batch_frames(headers: Sequence[Any]) -> list[Any]:
    """The batch of ``headers`` (1 to MAX_BATCH of them), in the codec's form."""
    if not 1 <= len(headers) <= MAX_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} messages, not {len(headers)}")
    packed: bytes = msgpack.packb(list(headers))  # each a bin (bytes or a buffer)
    return [BATCH_MAGIC, packed]


def coalesce(messages: Iterable[tuple[list[Any], bool]]) -> list[tuple[list[Any], int]]:
    """What to send to one peer for ``messages`` (its encoded messages in order, each with
    whether it may ride in a batch): each run of two or more batchable header-only messages
    becomes batches of at most MAX_BATCH; anything else goes alone, in place. Returns each
    message to send with how many of ``messages`` it carries, in order."""
    out: list[tuple[list[Any], int]] = []
    run: list[tuple[list[Any], Any]] = []  # (frames, header) of batchable messages in a row
    for frames, batchable in messages:
        # header_only, written out (a call per message): its header, if it has one alone
        if batchable and len(frames) == 2:
            magic, header = frames
            if (magic is MAGIC_FRAME or bytes(magic) == MAGIC_FRAME) and len(
                header
            ) < BATCH_HEADER_BELOW:
                run.append((frames, header))
                continue
        if run:
            _close_run(run, out)
            run = []
        out.append((frames, 1))
    if run:
        _close_run(run, out)
    return out


def _close_run(run: list[tuple[list[Any], Any]], out: list[tuple[list[Any], int]]) -> None:
    """:func:`coalesce`'s run of batchable messages, as batches of at most MAX_BATCH (a
    part of one goes as it is), onto ``out``."""
    for start in range(0, len(run), MAX_BATCH):
        part = run[start : start + MAX_BATCH]
        if len(part) == 1:
            out.append((part[0][0], 1))
        else:
            out.append((batch_frames([header for _, header in part]), len(part)))
