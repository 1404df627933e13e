"""Span readers: a hot message's header cut into the bytes its fields came in.

The broker forwards what it only routes without encoding it again. Two messages are built
here by splicing the bytes that arrived:

* a rank's own ``Exec``: the driver's header with the ``bindings`` map cut down to that
  rank's entry (a plaintext job's inputs, or a secure Exec in the codec's shape, every
  rank's box in its bindings; the call site's secure Exec has them after its header
  instead, ``mpl.wire.sealed_exec``, and is not cut);
* the ``JobResult`` of a job some of whose ``Done`` messages were decoded (no buffer
  frames, but extension types): each rank's values and stats, copied byte for byte into
  the one answer, under a header packed here.

Both only apply to messages whose header references no buffer frame: buffer indexes would
have to be renumbered, so larger messages take the codec's ordinary path. Everything here
reads headers the codec has already decoded and checked; when a layout is not the expected
one the functions return None and the caller encodes as before. The lean readers, which
check a header themselves, are :mod:`mpl.wire.hot`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.hot import header_packer, header_unpacker
from mpl.wire.jobs import Done, Exec, JobResult
from mpl.wire.limits import MAX_HEADER_BYTES
from mpl.wire.record import pinned_fields

__all__ = [
    "DoneSpans",
    "done_spans",
    "execs_for_ranks",
    "result_frames",
]

# execs_for_ranks and done_spans skip to fields by their place, result_frames packs a JobResult
# field by field: each must know every field
_EXEC_FIELDS = pinned_fields(
    Exec,
    ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s"),
    "mpl.wire.hot_spans",
)
_DONE_FIELDS = pinned_fields(
    Done, ("session", "job", "rank", "values", "stats", "metas", "saved"), "mpl.wire.hot_spans"
)
_RESULT_FIELDS = pinned_fields(
    JobResult,
    ("job", "values", "error", "missing_program", "stats", "metas"),
    "mpl.wire.hot_spans",
)
_EXEC_ITEMS = 1 + len(_EXEC_FIELDS)  # the tag, then the fields
_DONE_ITEMS = 1 + len(_DONE_FIELDS)
_RESULT_HEAD = bytes([0x90 | (1 + len(_RESULT_FIELDS))]) + msgpack.packb(JobResult.TAG)
_NONE, _FALSE = msgpack.packb(None), msgpack.packb(False)
_EMPTY_MAP, _ONE_ENTRY = msgpack.packb({}), bytes([0x81])
# Ranks and output indexes as msgpack writes them: the ones below 128 are a byte each
_FIXINTS: tuple[bytes, ...] = tuple(bytes([i]) for i in range(128))
_FIXSTRS: tuple[bytes, ...] = tuple(bytes([0xA0 | n]) for n in range(32))
_tls = threading.local()


def _int(n: int) -> bytes:
    if 0 <= n < 128:
        return _FIXINTS[n]
    packed: bytes = msgpack.packb(n)
    return packed


def _unpacker(header: bytes) -> tuple[Any, int]:
    """This thread's reusable Unpacker (the codec's limits) fed with ``header``, and its
    offset there (``tell()`` counts every byte it was ever fed). A reader that fails drops
    it: the Unpacker may still hold part of that header."""
    unpacker = getattr(_tls, "unpacker", None)
    if unpacker is None:
        unpacker = _tls.unpacker = header_unpacker()
    base = unpacker.tell()
    unpacker.feed(header)
    return unpacker, base


def _finished(unpacker: Any, base: int, header: bytes) -> bool:
    """Whether the header was read to its end; if not, the Unpacker is dropped (it still
    holds the rest), and the caller takes the ordinary path."""
    if unpacker.tell() - base == len(header):
        return True
    _tls.unpacker = None
    return False


def _map_spans(unpacker: Any, header: bytes, base: int) -> dict[int, bytes]:
    """The next value is a map with int keys: each entry's value as the bytes it came in."""
    spans: dict[int, bytes] = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        start = unpacker.tell() - base
        unpacker.skip()
        spans[key] = header[start : unpacker.tell() - base]
    return spans


_FIXMAPS: tuple[bytes, ...] = tuple(bytes([0x80 | n]) for n in range(16))


def _map_header(n: int) -> bytes:
    if n < 16:
        return _FIXMAPS[n]
    if n < 1 << 16:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


def _str(text: str) -> bytes:
    """``msgpack.packb(text)``, without making a Packer for a short one (a job id)."""
    data = text.encode()
    if len(data) < 32:
        return _FIXSTRS[len(data)] + data
    packed: bytes = header_packer().pack(text)
    return packed


def _header_only(frames: Sequence[Any]) -> bytes | None:
    """A message's header as bytes when it has no buffer frames (else None)."""
    if len(frames) != 2:
        return None
    header = frames[1]
    return header.bytes if hasattr(header, "bytes") else bytes(header)


# Where the cut maps and kept fields sit in the header array (the tag is item 0).
_EXEC_BINDINGS = 1 + _EXEC_FIELDS.index("bindings")
_DONE_VALUES = 1 + _DONE_FIELDS.index("values")
_DONE_STATS = 1 + _DONE_FIELDS.index("stats")
if _DONE_STATS < _DONE_VALUES:
    raise ImportError("mpl.wire.hot: Done's stats must follow its values; update done_spans")


def execs_for_ranks(frames: Sequence[Any], ranks: Sequence[int]) -> list[list[bytes]] | None:
    """Each of ``ranks``' own ``Exec`` (the driver's, with only that rank's bindings, or
    none), in their order, cut from a decoded ``Exec``'s frames (``[magic, header]``) in
    one walk over its header, with no Python call per rank: in secure mode every rank of
    every job gets its own. A rank's bindings entry goes out as the bytes it came in, key
    and all. None when the message has buffer frames or a layout this does not expect: the
    caller then encodes the ordinary way."""
    if len(frames) != 2:
        return None
    header = frames[1]
    if type(header) is not bytes:
        header = header.bytes if hasattr(header, "bytes") else bytes(header)
    unpacker = getattr(_tls, "unpacker", None)  # _unpacker, written out
    if unpacker is None:
        unpacker = _tls.unpacker = header_unpacker()
    base = unpacker.tell()
    unpacker.feed(header)
    skip, tell = unpacker.skip, unpacker.tell
    entries: dict[int, bytes] = {}  # rank -> its bindings entry (key and value), as it came
    try:
        if unpacker.read_array_header() != _EXEC_ITEMS:
            raise ValueError("not an Exec")
        for _ in range(_EXEC_BINDINGS):
            skip()
        start = tell() - base
        for _ in range(unpacker.read_map_header()):
            at = tell() - base
            key = unpacker.unpack()
            skip()
            entries[key] = header[at : tell() - base]
        end = tell() - base
        for _ in range(_EXEC_BINDINGS + 1, _EXEC_ITEMS):
            skip()
        if tell() - base != len(header):
            raise ValueError("bytes after the header")
    except Exception:  # any surprise: the caller encodes the ordinary way (and the
        _tls.unpacker = None  # Unpacker, which may still hold part of it, is dropped)
        return None
    head, tail, join = header[:start], header[end:], b"".join
    out: list[list[bytes]] = []
    for rank in ranks:  # a plain loop: a comprehension is one more call per job
        mine = entries.get(rank)
        if mine is None:
            out.append([MAGIC_FRAME, join((head, _EMPTY_MAP, tail))])
        else:
            out.append([MAGIC_FRAME, join((head, _ONE_ENTRY, mine, tail))])
    return out


class DoneSpans:
    """A ``Done``'s values (by output index) and stats, as the bytes they came in."""

    __slots__ = ("stats", "values")

    def __init__(self, values: dict[int, bytes], stats: bytes) -> None:
        self.values = values
        self.stats = stats


def done_spans(frames: Sequence[Any]) -> DoneSpans | None:
    """Cut a decoded ``Done``'s frames (``[magic, header]``) for :func:`result_frames`, in
    one walk over its header (skipping builds no objects: about a third of decoding it).
    None when the message has buffer frames or a layout this does not expect."""
    header = _header_only(frames)
    if header is None:
        return None
    return _cut_done(header)


def _cut_done(header: bytes) -> DoneSpans | None:
    unpacker, base = _unpacker(header)
    skip, tell = unpacker.skip, unpacker.tell
    try:
        if unpacker.read_array_header() != _DONE_ITEMS:
            raise ValueError("not a Done")
        for _ in range(_DONE_VALUES):
            skip()
        values = _map_spans(unpacker, header, base)
        for _ in range(_DONE_VALUES + 1, _DONE_STATS):
            skip()
        start = tell() - base
        skip()
        stats = header[start : tell() - base]
        for _ in range(_DONE_STATS + 1, _DONE_ITEMS):
            skip()
    except Exception:  # any surprise: the caller encodes the ordinary way
        _tls.unpacker = None
        return None
    if not _finished(unpacker, base, header):
        return None
    return DoneSpans(values, stats)


def result_frames(
    job: str,
    values: Mapping[int, Mapping[int, bytes]],
    stats: Mapping[int, bytes],
    metas: Mapping[int, str],
) -> list[bytes] | None:
    """A successful ``JobResult`` of ``job`` from the ranks' value and stats bytes.

    ``values[output][rank]`` and ``stats[rank]`` are spans from :func:`done_spans`, copied
    verbatim; ``metas`` were checked as ``dict[int, str]`` on decoding and are packed here.
    It decodes to ``JobResult(job, values, None, False, stats, metas)``; None when the
    header would exceed ``MAX_HEADER_BYTES`` (the codec then says why).
    """
    small, maps = _FIXINTS, _FIXMAPS  # below 128 ints, below 16 maps: a byte, no call
    n = len(values)
    parts = [_RESULT_HEAD, _str(job), maps[n] if n < 16 else _map_header(n)]
    for index, by_rank in values.items():
        n = len(by_rank)
        parts += (
            small[index] if 0 <= index < 128 else _int(index),
            maps[n] if n < 16 else _map_header(n),
        )
        for rank, value in by_rank.items():
            parts += (small[rank] if 0 <= rank < 128 else _int(rank), value)
    n = len(stats)
    parts += (_NONE, _FALSE, maps[n] if n < 16 else _map_header(n))
    for rank, raw in stats.items():
        parts += (small[rank] if 0 <= rank < 128 else _int(rank), raw)
    parts.append(header_packer().pack(metas) if metas else _EMPTY_MAP)
    header = b"".join(parts)
    if len(header) > MAX_HEADER_BYTES:
        return None
    return [MAGIC_FRAME, header]
