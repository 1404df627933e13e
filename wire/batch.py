"""Several small messages to one peer as one ZeroMQ message: fewer sends and wake-ups.

With many jobs in flight, a sender often has several hot messages queued for the same peer
at once (the driver's Execs, the broker's Execs to a worker and JobResults to a driver, a
worker's Dones). Each costs a libzmq send, a receive and, often, a thread wake-up at the
other end. What is *already queued* for one peer goes out as one batch instead; nothing
waits for a batch to fill, so no latency is added.

The wire form::

    frame 0       BATCH_MAGIC   b"MPB" + the codec's version byte (never a message's magic)
    frame 1..n    one header each: the inner message is [MAGIC_FRAME, header]

Only header-only messages (no buffer frames) ride in a batch; a sender sends anything else
alone, in its place (the messages after it to that peer go after it), so the order each
peer sees never changes (:func:`coalesce`). A receiver splits a batch with :func:`split_batch` and
handles each inner message exactly as if it had arrived alone from the same peer, with the
same authenticated identity (the batch's frames carry the connection's CURVE User-Id) and
every check it gets alone. Splitting runs no code and grows nothing: it checks the count
(1 to :data:`MAX_BATCH` inner messages; a batch of one is legal, an empty or larger one is
refused) and that no inner frame is itself a batch, then pairs each header with the magic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mpl.wire.codec import MAGIC_FRAME, VERSION
from mpl.wire.errors import ProtocolError

__all__ = [
    "BATCH_MAGIC",
    "MAX_BATCH",
    "batch_frames",
    "coalesce",
    "header_only",
    "is_batch",
    "split_batch",
]

BATCH_MAGIC = b"MPB" + bytes([VERSION])
# Inner messages per batch: a sender never puts more in one, a receiver refuses more. It
# bounds what one receive makes a receiver do before its timers and other peers get a turn.
MAX_BATCH = 64
_MAGIC_LEN = len(BATCH_MAGIC)


def is_batch(frames: Sequence[Any]) -> bool:
    """Whether ``frames`` (one message, without a routing envelope) is a batch."""
    if not frames:
        return False
    first = frames[0]
    # len() of a received zmq.Frame is its size: only a 4-byte first frame is looked at
    return len(first) == _MAGIC_LEN and bytes(first) == BATCH_MAGIC


def split_batch(frames: Sequence[Any]) -> list[list[Any]]:
    """The inner messages of batch ``frames``, each ``[MAGIC_FRAME, header]`` as it would
    have arrived alone. Raises ProtocolError for an empty batch, one of more than
    ``MAX_BATCH`` messages, or one holding a batch; the inner headers are not read here (the
    receiver decodes each as it would decode the message alone)."""
    count = len(frames) - 1
    if count < 1:
        raise ProtocolError("an empty batch")
    if count > MAX_BATCH:
        raise ProtocolError(f"a batch of {count} messages (at most {MAX_BATCH})")
    inner = frames[1:]
    for frame in inner:
        if len(frame) == _MAGIC_LEN and bytes(frame) == BATCH_MAGIC:
            raise ProtocolError("a batch inside a batch")
    return [[MAGIC_FRAME, frame] for frame in inner]


def header_only(frames: Sequence[Any]) -> Any | None:
    """The header of an encoded message without buffer frames (one that may ride in a
    batch), or None."""
    if len(frames) == 2 and (frames[0] is MAGIC_FRAME or bytes(frames[0]) == MAGIC_FRAME):
        return frames[1]  # the identity check first: most frames are the codec's own
    return None


def batch_frames(headers: Sequence[Any]) -> list[Any]:
    """The batch of ``headers`` (1 to MAX_BATCH of them)."""
    if not 1 <= len(headers) <= MAX_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} messages, not {len(headers)}")
    return [BATCH_MAGIC, *headers]


def coalesce(messages: Iterable[tuple[list[Any], bool]]) -> list[tuple[list[Any], int]]:
    """What to send to one peer for ``messages`` (its encoded messages in order, each with
    whether it may ride in a batch): each run of two or more batchable header-only messages
    becomes batches of at most MAX_BATCH; anything else goes alone, in place. Returns each
    message to send with how many of ``messages`` it carries, in order."""
    out: list[tuple[list[Any], int]] = []
    run: list[tuple[list[Any], Any]] = []

    def close_run() -> None:
        for start in range(0, len(run), MAX_BATCH):
            part = run[start : start + MAX_BATCH]
            if len(part) == 1:
                out.append((part[0][0], 1))
            else:
                out.append((batch_frames([header for _, header in part]), len(part)))
        run.clear()

    for frames, batchable in messages:
        header = header_only(frames) if batchable else None
        if header is None:
            close_run()
            out.append((frames, 1))
        else:
            run.append((frames, header))
    close_run()
    return out
