"""A secure ``Exec`` on the wire: one common header, then each rank's sealed box after it,
so the broker forwards it without cutting a header per rank.

From the driver to the broker, one frame (wire version 4; in the codec's form,
``mpl.wire.codec.from_wire``, the magic and the rest)::

    frame 0   SEALED_EXEC_MAGIC   b"MPS" + the codec's version byte; then
              the Exec's header, packed as ``encode`` packs it, its bindings empty; then
              the sealed box of ``ranks[0]``, ..., ``ranks[n-1]``, each a msgpack bin

To each rank ``ranks[i]``, one frame: the magic, then the header as it came followed by
the ``i``-th box alone, its bytes as they came. Boxes ride in the header's frame, not in
frames of their own: under CurveZMQ every frame is one more box to seal and open and one
more message part for libzmq (measured: a frame per box cost the broker about 30k
instructions more per 2-rank job than the cut it saves).

The broker reads the header on the plaintext lean path (:func:`read_sealed_exec`: exactly
what ``decode`` accepts, bindings empty) and checks that one box follows per rank, each 1
to :data:`MAX_BOX_BYTES` bytes, and nothing else; it never reads a box. A sender's repeat
of its last header but for the job id (the same program again: most jobs) is read by
comparison with that one (:class:`SealedExecReaders`, ``mpl.wire.exec_repeat``), its boxes
by their bin heads: the same answer, several times cheaper than the lean read (which
builds the header's objects and checks their types). A worker reads the
header as it reads a plaintext Exec (``mpl.wire.exec_repeat``) and opens its box
(:func:`split_own`), which is bound to its sender, its recipient worker process, the
session, the job, its number and every other field of the header
(``mpl.wire.seal_contexts``): a box moved to another rank, job or header does not open.

Only compact boxes travel so (every job without large inputs); an Exec with a ``Sealed``
record among its bindings keeps the codec's shape (the boxes in the header's bindings).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from zmq import Frame

from mpl.wire.codec import MAGIC_FRAME, VERSION, decode
from mpl.wire.errors import ProtocolError
from mpl.wire.exec_repeat import RepeatExecs
from mpl.wire.hot import header_unpacker, read_hot_header
from mpl.wire.jobs import Exec
from mpl.wire.limits import MAX_CONTAINERS
from mpl.wire.msgpack_bins import BIN8, BIN16, bin_bounds

__all__ = [
    "BIN8_HEADS",
    "MAX_BOX_BYTES",
    "SEALED_EXEC_MAGIC",
    "SealedExecReaders",
    "is_sealed_exec",
    "read_sealed_exec",
    "split_own",
]

SEALED_EXEC_MAGIC = b"MPS" + bytes([VERSION])
# A compact box holds less than COMPACT_MAX (32 KiB) of ciphertext plus its head: a box
# over this is no box (nor is an empty one); every box fits a bin8 or a bin16
MAX_BOX_BYTES = 0xFFFF
BIN8_HEADS: tuple[bytes, ...] = tuple(bytes([0xC4, n]) for n in range(256))  # bin8 of n bytes
_MAGIC_LEN = len(SEALED_EXEC_MAGIC)
_tls = threading.local()


def is_sealed_exec(frames: Sequence[Any]) -> bool:
    """Whether ``frames`` (one message, no routing envelope) begins with the sealed Exec's
    magic (len() of a received ``zmq.Frame`` is its size: only a 4-byte frame is read)."""
    if not frames:
        return False
    first = frames[0]
    return len(first) == _MAGIC_LEN and bytes(first) == SEALED_EXEC_MAGIC


def _box_bounds(data: bytes, at: int) -> tuple[int, int]:
    """Where the bytes of the box whose head is at ``data[at]`` (a msgpack bin8 or bin16 of
    1 to ``MAX_BOX_BYTES`` bytes) begin and end; ``ProtocolError`` for anything else there."""
    bounds = bin_bounds(data, at, widest=BIN16)
    if bounds is None:
        raise ProtocolError("a sealed Exec's box is no msgpack bin of at most 64 KiB")
    start, stop = bounds
    if stop == start or stop > len(data):
        raise ProtocolError(
            f"a sealed Exec's box of {stop - start} bytes, {len(data) - start} there"
        )
    return bounds


def _header_end(data: bytes) -> int:
    """Where the header (one msgpack value, under the codec's limits) ends in ``data``
    (a fresh Unpacker: the rest of ``data`` stays in one, so it is not this thread's)."""
    unpacker = header_unpacker()
    unpacker.feed(data)
    try:
        unpacker.skip()
    except Exception:
        raise ProtocolError("a sealed Exec's header does not read") from None
    end: int = unpacker.tell()
    return end


def _decoded(header: bytes) -> Exec:
    """The Exec ``header`` holds as ``decode`` reads it (one the lean reader left), bindings
    empty; ``ProtocolError`` saying why not."""
    msg = decode([MAGIC_FRAME, header], unpickle=False)
    if type(msg) is not Exec:
        raise ProtocolError(f"a sealed Exec's header holds a {msg.TAG!r} record")
    if msg.bindings:
        raise ProtocolError("a sealed Exec's header carries bindings (its boxes follow it)")
    return msg


def read_sealed_exec(frames: Sequence[Any], max_ranks: int) -> tuple[Exec, bytes, list[bytes]]:
    """A driver's sealed Exec (the broker's reading): its ``Exec`` (bindings empty), its
    header's bytes, and each rank's box as it came (its msgpack bin head and all), in the
    order of its ``ranks``. ``ProtocolError`` when the header names more than ``max_ranks``
    ranks (the cluster's size), or unless exactly one box follows the header per rank, each
    a bin of 1 to ``MAX_BOX_BYTES`` bytes.

    Nothing here grows with the ranks a sender claims beyond the frame it sent: each box is
    a slice of it, and the header is joined to a rank's box only when the job is sent
    (``mpl.broker.actions.box_execs``, after the sender, its session and the ranks were
    checked). One walk over the frame with this thread's Unpacker (the header skipped, then
    each box: no Python call per rank), which it reads to its end or drops."""
    first = frames[0] if len(frames) == 2 else b""
    if len(first) != _MAGIC_LEN or bytes(first) != SEALED_EXEC_MAGIC:
        raise ProtocolError("a sealed Exec is its magic and one frame")
    raw = frames[1]
    data = raw.bytes if type(raw) is Frame else bytes(raw)
    size = len(data)
    if size >= MAX_CONTAINERS:  # as the lean readers bound a header
        raise ProtocolError(f"a sealed Exec of {size} bytes")
    unpacker = getattr(_tls, "unpacker", None)
    if unpacker is None:
        unpacker = _tls.unpacker = header_unpacker()
    base = unpacker.tell()
    unpacker.feed(data)
    skip, tell = unpacker.skip, unpacker.tell
    try:
        skip()
        end = tell() - base
        head = data[:end]
        read = read_hot_header(MAGIC_FRAME, head)
        if type(read) is not Exec or read.bindings:
            read = _decoded(head)  # says why, or reads what the lean reader left
        ranks = read.ranks
        if len(ranks) > max_ranks:
            raise ProtocolError(
                f"a sealed Exec for {len(ranks)} ranks, in a cluster of {max_ranks}"
            )
        boxes: list[bytes] = []
        for _ in ranks:  # a plain loop: no Python call per rank
            at = tell() - base
            if at == size:
                raise ProtocolError(
                    f"a sealed Exec of {len(ranks)} ranks carries {len(boxes)} boxes (one per rank)"
                )
            skip()
            stop = tell() - base
            mark = data[at]
            if not (
                (mark == BIN8 and stop > at + 2) or (mark == BIN16 and stop > at + 3)
            ):  # a bin8 or bin16 (at most MAX_BOX_BYTES) holding at least a byte
                raise ProtocolError(f"a sealed Exec's box of {stop - at} bytes is no box")
            boxes.append(data[at:stop])
        if tell() - base != size:
            raise ProtocolError(
                f"a sealed Exec of {len(ranks)} ranks carries more (one box per rank)"
            )
    except ProtocolError:
        _tls.unpacker = None  # it may still hold part of this frame
        raise
    except Exception as exc:
        _tls.unpacker = None
        raise ProtocolError(f"a sealed Exec does not read: {type(exc).__name__}") from None
    return read, head, boxes


# senders whose last sealed Exec header is kept (the oldest out first), and the longest
# header kept: each keeps it as the objects it was read into (a hostile header of empty
# containers builds ~75 bytes of objects per byte: 64 x 1 KiB keep under 5 MB)
_READERS = 64
_KEPT_BELOW = 1024


class SealedExecReaders:
    """The broker's reading of sealed Execs (:func:`read_sealed_exec`), per sender: a
    sender's last header read in full is kept (``mpl.wire.exec_repeat``), and a frame that
    repeats it but for the job id is read by comparison, its boxes by their bin heads
    (``RepeatExecs.repeat_sealed_boxes``): what :func:`read_sealed_exec` answers, without
    its Unpacker walk and lean read. Anything else is read in full. One reader per sender: the bytes
    compared with came from that sender's connection and were accepted there (who may send
    them is checked per message, after). Bounded: at most ``_READERS`` senders. Not
    thread-safe: the broker's loop alone reads."""

    def __init__(self) -> None:
        self._readers: dict[bytes, RepeatExecs] = {}

    def repeat_frame(
        self, peer: bytes, data: bytes, max_ranks: int
    ) -> tuple[Exec, list[bytes]] | None:
        """The broker loop's reading of a sealed Exec frame as received, ``data`` (its
        magic, then the rest), from ``peer`` that repeats that sender's last header but
        for the job id: what :meth:`read` answers for it, as the frames the broker
        forwards (``[SEALED_EXEC_MAGIC, header, box, ...]``), in one walk
        (``RepeatExecs.repeat_sealed_boxes``). None for anything else, with nothing read
        or kept: the caller reads it with :meth:`read`, which says why or reads it in full
        (``tests/test_sealed_exec_inline.py`` checks both agree on mutated frames)."""
        reader = self._readers.get(peer)
        if reader is None:
            return None
        return reader.repeat_sealed_boxes(data, SEALED_EXEC_MAGIC, max_ranks)

    def read(
        self, peer: bytes, frames: Sequence[Any], max_ranks: int
    ) -> tuple[Exec, bytes, list[bytes]]:
        """:func:`read_sealed_exec` of ``frames`` from ``peer``."""
        reader = self._readers.get(peer)
        if reader is not None and len(frames) == 2:
            first, raw = frames
            if len(first) == _MAGIC_LEN and bytes(first) == SEALED_EXEC_MAGIC:
                # the frame as it came in one part, read as repeat_frame reads it
                data = raw.bytes if type(raw) is Frame else bytes(raw)
                magic = SEALED_EXEC_MAGIC
                said = reader.repeat_sealed_boxes(magic + data, magic, max_ranks)
                if said is not None:
                    read, parts = said  # [magic, header, box, ...]
                    return read, parts[1], parts[2:]
        read, head, boxes = read_sealed_exec(frames, max_ranks)
        if len(head) < _KEPT_BELOW:
            if reader is None:
                readers = self._readers
                if len(readers) >= _READERS:  # bounded: the oldest sender's goes
                    del readers[next(iter(readers))]
                reader = readers[peer] = RepeatExecs()
            reader.read_in_full([MAGIC_FRAME, head])  # kept to compare the next ones with
        return read, head, boxes


def split_own(data: bytes) -> tuple[bytes, bytes]:
    """A rank's sealed Exec frame (the worker's reading, of one it did not read as a
    repeat): its header, and its one box's bytes. ``ProtocolError`` for anything else."""
    if len(data) >= MAX_CONTAINERS:
        raise ProtocolError(f"a sealed Exec of {len(data)} bytes")
    end = _header_end(data)
    start, stop = _box_bounds(data, end)
    if stop != len(data):
        raise ProtocolError("a sealed Exec for one rank carries more than one box")
    return data[:end], data[start:stop]
