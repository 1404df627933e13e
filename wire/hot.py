"""Lean readers for the messages the broker and workers handle on every job.

The broker decodes (and so checks) every message it receives. A ``Done`` of the hot path
(no buffer frames, extension types or saved names) is not decoded into a record at all:
:func:`read_done` reads its header in one call under the codec's limits and checks each
field as the record's annotations would; when every rank's Done of a job was read so, the
answer is packed from what was read in one C call (:func:`packed_result`: plain msgpack in,
plain msgpack out). ``tests/test_done_read.py`` compares it with ``decode`` on mutated
messages. An ``Exec`` is read the same way and built without the general decoder
(:func:`read_exec`). What a header's bytes are cut into for splicing (a rank's own Exec, a
JobResult from decoded Dones) is :mod:`mpl.wire.hot_spans`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq

from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.decoder import TUPLE, check_nesting
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Done, Exec, JobResult
from mpl.wire.limits import (
    INT_MAX,
    INT_MIN,
    MAX_CONTAINERS,
    MAX_HEADER_BYTES,
    MAX_HEADER_ITEMS,
    MAX_NESTING,
    MAX_SAME_HASH,
)
from mpl.wire.record import pinned_fields
from mpl.wire.run_stats import MAX_STATS_BYTES

__all__ = [
    "DONE_FRAME_PREFIX",
    "DONE_PREFIX",
    "EXEC_PREFIX",
    "DoneRead",
    "header_packer",
    "header_unpacker",
    "packed_result",
    "read_done",
    "read_done_header",
    "read_exec",
    "read_hot",
    "read_hot_header",
    "result_record",
]

# read_exec and read_done check each field by hand as its annotation says, and Exec and
# JobResult are filled in directly
# (record.built without its two calls): each must know every field.
_EXEC_FIELDS = pinned_fields(
    Exec,
    ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s"),
    "mpl.wire.hot",
    direct=True,
)
_DONE_FIELDS = pinned_fields(
    Done, ("session", "job", "rank", "values", "stats", "metas", "saved"), "mpl.wire.hot"
)
_RESULT_FIELDS = pinned_fields(
    JobResult,
    ("job", "values", "error", "missing_program", "stats", "metas"),
    "mpl.wire.hot",
    direct=True,
)
_EXEC_ITEMS = 1 + len(_EXEC_FIELDS)  # the tag, then the fields
_DONE_ITEMS = 1 + len(_DONE_FIELDS)
_EXEC_BINDINGS = 1 + _EXEC_FIELDS.index("bindings")  # where bindings sit (the tag is item 0)
# msgpack's list and map markers: fixmap, fixarray, array 16/32, map 16/32
_CONTAINER_MARKERS = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
# How every Done header begins: its array header, then its tag. The broker's shell sends
# headers that begin so to read_done (anything else, or a surprise there, to decode).
DONE_PREFIX = bytes([0x90 | _DONE_ITEMS]) + msgpack.packb(Done.TAG)
# how a Done of one frame (wire v4: the magic, then its header) begins
DONE_FRAME_PREFIX = MAGIC_FRAME + DONE_PREFIX
EXEC_PREFIX = bytes([0x90 | _EXEC_ITEMS]) + msgpack.packb(Exec.TAG)
_tls = threading.local()
_unpackb = msgpack.unpackb
_Frame = zmq.Frame


def header_unpacker(ext_hook: Any = None, map_len: int = MAX_HEADER_ITEMS) -> Any:
    """A new streaming Unpacker under the codec's limits (``ext_hook`` for extension types,
    if given; ``map_len``: keys one map may hold). Making one costs more than reading a
    Done header: readers keep one per thread, and drop it when a read fails (it may still
    hold part of that header)."""
    hooks = {} if ext_hook is None else {"ext_hook": ext_hook}
    return msgpack.Unpacker(
        None,
        raw=False,
        strict_map_key=False,
        max_buffer_size=MAX_HEADER_BYTES,
        max_array_len=MAX_HEADER_ITEMS,
        max_map_len=map_len,
        **hooks,
    )


def _new_unpacker(slot: str, ext_hook: Any = None, map_len: int = MAX_HEADER_ITEMS) -> Any:
    """A new :func:`header_unpacker`, kept as this thread's ``slot``."""
    unpacker = header_unpacker(ext_hook, map_len)
    setattr(_tls, slot, unpacker)
    return unpacker


def header_packer() -> Any:
    """This thread's Packer (making one costs more than packing a job's metas with it)."""
    packer = getattr(_tls, "packer", None)
    if packer is None:
        packer = _tls.packer = msgpack.Packer()
    return packer


def result_record(
    job: str, values: dict[int, dict[int, Any]], stats: dict[int, Any], metas: dict[int, str]
) -> JobResult:
    """``JobResult(job, values, None, False, stats, metas)`` without its ``__init__``: for
    values, stats and metas the broker read and checked itself (``read_done`` or decode)."""
    result = _new(JobResult)
    # with keywords, as _RESULT_FIELDS pins them: a __dict__ filled from a zip (or key by
    # key) makes every later read of a field about twice as slow
    result.__dict__.update(
        job=job, values=values, error=None, missing_program=False, stats=stats, metas=metas
    )
    return result


class DoneRead:
    """A ``Done`` as :func:`read_done` found it: its fields, checked as the record's
    annotations say, of plain msgpack types only (no extension types). Only
    :func:`read_done` makes one, filling in every slot."""

    __slots__ = ("job", "metas", "rank", "saved", "session", "stats", "values")

    session: str
    job: str
    rank: int
    values: dict[int, Any]
    stats: bytes  # the rank's stats blob (mpl.wire.run_stats), copied into the answer unread
    metas: dict[int, str]
    saved: list[Any]

    TAG = Done.TAG


class _ExtSeen(Exception):
    """An extension type in a Done's header: read_done leaves the message to decode."""


def _no_ext(code: int, data: bytes) -> Any:
    raise _ExtSeen


def _lean_header(frames: Sequence[Any]) -> bytes | None:
    """The header of a message the lean readers may take: the magic and a header only (no
    buffer frames), shorter than MAX_CONTAINERS bytes, which therefore cannot build more
    containers than that; None for anything else (decode reads it)."""
    if len(frames) != 2:
        return None
    magic, header = frames
    try:
        if len(header) >= MAX_CONTAINERS:  # (a large header is not copied to be refused)
            return None
        # a zmq.Frame's bytes, a copy made once (about half the cost of a memoryview's)
        magic = magic.bytes if type(magic) is _Frame else bytes(magic)
        header = header.bytes if type(header) is _Frame else bytes(header)
    except TypeError:
        return None
    if magic != MAGIC_FRAME or len(header) >= MAX_CONTAINERS:
        return None
    return header


_INT_ONLY, _BYTES_ONLY = {int}, {bytes}
_new = object.__new__
# msgpack's int formats are int64 and uint64: an int it decodes always fits the codec's
# 64-bit range (limits.int_fits), so the lean readers need no range check on one
if (INT_MIN, INT_MAX) != (-(1 << 63), (1 << 64) - 1):
    raise ImportError("mpl.wire.hot: the lean readers rely on the 64-bit int range")


def read_done(frames: Sequence[Any]) -> DoneRead | None:
    """Read a ``Done`` of the hot path without building the record, in one call over its
    header: None unless it is one (no buffer frames, the right magic, no extension types,
    no saved names) and ``decode`` would accept it.

    The fields are checked as ``Done``'s annotations say (``session``/``job`` str, ``rank``
    a 64-bit int, ``values`` and ``metas`` keyed by 64-bit ints, ``metas`` of str), under
    the codec's limits (items per container, nesting, containers per header); ``stats``
    must be a blob of at most ``MAX_STATS_BYTES``, which is not parsed here (nobody on the
    job's path reads it: it goes into the answer as it came, and its reader checks it).
    On None the caller decodes the ordinary way, which accepts the message or says why
    not.
    """
    header = _lean_header(frames)
    if header is None or not header.startswith(DONE_PREFIX):
        return None
    return read_done_header(header)


def read_hot(frames: Sequence[Any]) -> DoneRead | Exec | None:
    """A hot message read by its lean reader: a ``Done`` as :func:`read_done` reads it, an
    ``Exec`` as :func:`read_exec` builds it; None for anything else, or anything either
    reader leaves to ``decode`` (which accepts it or says why not). Its magic is the
    codec's, so it is no batch (``mpl.wire.batch``). It raises nothing."""
    # the frames' bytes, then read_hot_header's checks (the broker's loop takes the bytes
    # of the frames it received itself, and calls read_hot_header directly)
    if len(frames) != 2:
        return None
    magic, header = frames
    try:
        if len(header) >= MAX_CONTAINERS:  # (a large header is not copied to be refused)
            return None
        magic = magic.bytes if type(magic) is _Frame else bytes(magic)
        header = header.bytes if type(header) is _Frame else bytes(header)
    except TypeError:
        return None
    return read_hot_header(magic, header)


def read_hot_header(magic: bytes, header: bytes) -> DoneRead | Exec | None:
    """:func:`read_hot` of a message's magic and header given as bytes (the broker cuts
    them from the frame it received, and counts its bytes, itself)."""
    if magic != MAGIC_FRAME or len(header) >= MAX_CONTAINERS:
        return None
    if header.startswith(DONE_PREFIX):
        return read_done_header(header)
    if header.startswith(EXEC_PREFIX):
        return _read_exec(header)
    return None


def read_done_header(header: bytes) -> DoneRead | None:
    """:func:`read_done` of a header shorter than ``MAX_CONTAINERS`` bytes that begins
    with ``DONE_PREFIX`` (so it reads, if at all, as a list of the Done's items, tag first;
    the broker's loop, which checks both, calls it directly for a Done of one frame)."""
    # the whole header in one call: walking it field by field to cut each value's bytes
    # cost twice that, and the answer is packed from what is read here (packed_result).
    # unpackb, not a kept Unpacker's feed, unpack and two tells (~1.9k instructions more
    # per Done): its default limits are the header's length, which a header shorter than
    # MAX_CONTAINERS reaches before the codec's, and it refuses bytes after the header
    # maps of at most MAX_SAME_HASH keys (msgpack's ValueError past it): decode counts a
    # longer one's hashes (check_spread), which keys of one hash flood, each costing as
    # many comparisons as came before it (a party's 256 KiB Done of float keys of one hash
    # took this reader 15 ms where decode refused it at its first map)
    try:
        items = _unpackb(
            header,
            raw=False,
            strict_map_key=False,
            ext_hook=_no_ext,
            max_map_len=MAX_SAME_HASH,
        )
    except Exception:  # anything unexpected: decode reads it, or says why not
        return None
    # the prefix made it a list of _DONE_ITEMS, tag first; each field's type checked by
    # identity, then each key and item of its maps in a loop (a Done has a value or two:
    # a map() and a set display per check cost ~10k instructions more per Done)
    _, session, job, rank, values, stats, metas, saved = items
    if not (
        type(session) is str
        and type(job) is str
        and type(rank) is int
        and type(values) is dict
        and type(stats) is bytes
        and type(metas) is dict
        and type(saved) is list
        and not saved  # saved names are records: decode checks them
        and len(stats) <= MAX_STATS_BYTES  # the broker's state refuses it
    ):
        return None
    nests = False  # whether a value is a list or a dict (tuples are extensions: refused)
    for index, value in values.items():
        if type(index) is not int:
            return None
        if type(value) is list or type(value) is dict:
            nests = True
    for index, meta in metas.items():
        if type(index) is not int or type(meta) is not str:
            return None
    # Too short to nest that deep, too few list and map markers to (every container in
    # it, the header array included, starts with one such byte, so no container sits
    # deeper than their count: one C call counts them), or nothing in it that could:
    # metas hold strs, saved is empty, stats are a blob, and values that are no
    # containers (sealed boxes, in secure mode) nest nothing.
    if (
        nests
        and len(header) > MAX_NESTING
        and len(header) - len(header.translate(None, _CONTAINER_MARKERS)) > MAX_NESTING
    ):
        try:
            check_nesting([values, stats, metas, saved])
        except ProtocolError:
            return None
    # filled in slot by slot: no __init__ call per Done
    read = _new(DoneRead)
    read.session, read.job, read.rank, read.values = session, job, rank, values
    read.stats, read.metas, read.saved = stats, metas, saved
    return read


def packed_result(
    job: str,
    values: dict[int, dict[int, Any]],
    stats: dict[int, bytes],
    metas: dict[int, str],
) -> list[bytes] | None:
    """The frames of ``JobResult(job, values, None, False, stats, metas)`` packed in one
    C call, for values and stats that :func:`read_done` read (plain msgpack only: no
    extension types, so they pack back to what they were read from, up to the width of a
    number); None when the header would exceed ``MAX_HEADER_BYTES`` (the codec then says
    why)."""
    # this thread's Packer (header_packer, written out: a call fewer per job)
    packer = getattr(_tls, "packer", None) or header_packer()
    header: bytes = packer.pack([JobResult.TAG, job, values, None, False, stats, metas])
    if len(header) > MAX_HEADER_BYTES:
        return None
    return [MAGIC_FRAME, header]


# tuples of small ints read_exec has read (ranks and inline, the same on most jobs), by
# their bytes: at most _TUPLES_KEPT, the table emptied when full
_tuples: dict[bytes, tuple[int, ...]] = {}
_TUPLES_KEPT = 256
_TUPLE_BYTES_KEPT = 256  # longer ones are read each time
_TUPLE_INT_END = 1 << 32  # the items of a tuple read here are below this


def _small_tuple(code: int, data: bytes) -> Any:
    """The one extension read_exec reads itself: a tuple of ints (ranks, output indexes).
    Any other extension, or a tuple of anything else, leaves the message to decode."""
    if code != TUPLE:
        raise _ExtSeen
    known = _tuples.get(data)
    if known is not None:
        return known
    n = len(data) - 1
    if 0 <= n < 16 and data[0] == 0x90 | n and (n == 0 or max(data[1:]) < 0x80):
        if len(_tuples) >= _TUPLES_KEPT:
            _tuples.clear()
        made = _tuples[data] = tuple(data[1:])
        return made
    items = msgpack.unpackb(data, raw=False)  # a longer tuple (32 ranks): of ints only here
    # ints only (decoded by msgpack, each fits 64 bits), no call per item; and of 32 bits,
    # not negative, as ranks and output indexes are: a tuple of any two 64-bit ints can be
    # made to share its hash with as many others as fit (its last item solved for it), and
    # such keys of a bindings map, built before their type is checked, cost the square of
    # their number (8,000 in a 136 KB header held this reader 0.6 s); decode reads the
    # others, counting each map's hashes (mpl.wire.limits.check_spread)
    if (
        type(items) is not list
        or not {*map(type, items)} <= _INT_ONLY
        or (items and not (min(items) >= 0 and max(items) < _TUPLE_INT_END))
    ):
        raise _ExtSeen
    made = tuple(items)
    if len(data) <= _TUPLE_BYTES_KEPT:
        if len(_tuples) >= _TUPLES_KEPT:
            _tuples.clear()
        _tuples[data] = made
    return made


# An Exec's header items by type, tag first (timeout_s a float or an int)
_EXEC_TYPES = {(str, str, str, str, tuple, dict, tuple, t) for t in (float, int)}


def read_exec(frames: Sequence[Any]) -> Exec | None:
    """Read an ``Exec`` of the hot path in one msgpack call and build the record without
    the general decoder: None unless it is one (no buffer frames, the right magic, no
    extension but short tuples of small ints) and ``decode`` would accept it.

    The fields are checked as ``Exec``'s annotations say (``session``, ``job``, ``digest``
    str; ``ranks`` and ``inline`` tuples of ints; ``bindings`` keyed by 64-bit ints;
    ``timeout_s`` a float or an int), under the codec's limits. On None the caller decodes
    the ordinary way, which accepts the message or says why not.
    """
    header = _lean_header(frames)
    if header is None or not header.startswith(EXEC_PREFIX):
        return None
    return _read_exec(header)


def _read_exec(header: bytes) -> Exec | None:
    """:func:`read_exec` of a header :func:`_lean_header` took that begins with
    ``EXEC_PREFIX``."""
    # this thread's Unpacker for Exec headers: msgpack.unpackb's keyword arguments cost
    # more than reading the header
    unpacker = getattr(_tls, "exec", None)
    if unpacker is None:  # maps of at most MAX_SAME_HASH keys, as read_done_header says
        unpacker = _new_unpacker("exec", _small_tuple, MAX_SAME_HASH)
    base = unpacker.tell()
    unpacker.feed(header)
    try:
        items = unpacker.unpack()
        if unpacker.tell() - base != len(header):
            raise ValueError("bytes after the header")
    except Exception:  # decode reads it, or says why not
        _tls.exec = None  # it may still hold part of this header
        return None
    # the prefix made it a list of _EXEC_ITEMS, tag first: every field's type at once
    # (ranks and inline are tuples of ints: _small_tuple built them), then bindings' keys
    if (
        tuple(map(type, items)) not in _EXEC_TYPES
        or not {*map(type, items[_EXEC_BINDINGS])} <= _INT_ONLY
    ):
        return None
    # too short to nest that deep, only bindings that nest nothing (none, or sealed boxes:
    # told first, as it costs no pass over the header), or too few list and map markers to
    # (as read_done says): ranks and inline are tuples, bounded on their own
    if (
        len(header) > MAX_NESTING
        and not {*map(type, items[_EXEC_BINDINGS].values())} <= _BYTES_ONLY
        and len(header) - len(header.translate(None, _CONTAINER_MARKERS)) > MAX_NESTING
    ):
        try:
            check_nesting(items)
        except ProtocolError:
            return None
    _, s, j, d, r, b, i, t = items
    exec_ = _new(Exec)  # filled in directly, with keywords (_EXEC_FIELDS, checked on import)
    exec_.__dict__.update(session=s, job=j, digest=d, ranks=r, bindings=b, inline=i, timeout_s=t)
    return exec_
