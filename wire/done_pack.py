"""Done frames on the worker's hot path: the same bytes as ``encode``, a fraction of the work.

A worker answers every job it ran with a ``Done`` it built itself (``jobs.py``): the small
outputs, the run's stats blob (``mpl.wire.run_stats``), the outputs' descriptions. Most
of these hold only plain data (ints, floats, strings, short bytes), which msgpack packs as
they are. For those,
:func:`done_frames` packs the header in one call, without the general encoder's copy of
the whole record (``_prepare``) and its per-value type dispatch. The frames are byte for
byte what :func:`mpl.wire.codec.encode` writes, in either mode (plain data is in the safe
value format), so the broker and the driver decode and check them as before
(``tests/test_done_frames.py`` compares them): this saves the sender's work only.

Anything else (a tuple, an array, a big int, a buffer, a name saved by the job, nesting
past a few levels, a string msgpack cannot encode) returns None: the caller then uses
``encode``, which packs it or says why not.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import msgpack

from mpl.wire.codec import _INLINE_BYTES, MAGIC_FRAME, MAX_HEADER_BYTES
from mpl.wire.jobs import Done
from mpl.wire.record import pinned_fields

__all__ = ["OneSpanDone", "done_frames", "own_done_fields", "own_done_frames"]

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_ATOMS = frozenset({str, float, bool, type(None)})
_DEPTH = 4  # deeper values take the codec's path (which also enforces MAX_NESTING)
_TAG = Done.TAG
# done_frames lists Done's fields by hand: a field added to Done must be added there too,
# or every answer would be packed without it.
_FIELDS = pinned_fields(
    Done, ("session", "job", "rank", "values", "stats", "metas", "saved"), "mpl.wire.done_pack"
)


class _Packer(threading.local):
    """A packer per thread: answers leave from the I/O thread and from job threads."""

    def __init__(self) -> None:
        self.pack = _packer()


def _packer() -> Any:
    return msgpack.Packer(use_bin_type=True, strict_types=True, autoreset=True).pack


_tls = _Packer()


def done_frames(msg: Done) -> list[Any] | None:
    """``encode(msg)`` for a ``Done`` of plain data (see the module docstring), else None."""
    if type(msg) is not Done or msg.saved:
        return None
    fields = [_TAG, msg.session, msg.job, msg.rank, msg.values, msg.stats, msg.metas, []]
    if not _plain(fields, 0):
        return None
    try:
        header: bytes = _tls.pack(fields)
    except Exception:  # a string msgpack cannot encode, say: encode reports it
        _tls.pack = _packer()  # never reuse a packer that failed mid-way
        return None
    if len(header) > MAX_HEADER_BYTES:
        return None  # encode raises, saying why
    return [MAGIC_FRAME, header]


def own_done_frames(msg: Done) -> list[Any] | None:
    """:func:`done_frames` for a ``Done`` whose stats, metas and saved list this process
    built itself (the worker's job shell: the stats blob it packed, descriptions): only its
    values, which user code made, are checked for plain data. The bytes are the same; None
    where ``done_frames`` would say None."""
    if msg.saved or type(msg.values) is not dict:
        return None
    return own_done_fields(msg.session, msg.job, msg.rank, msg.values, msg.stats, msg.metas)


def own_done_fields(
    session: str,
    job: str,
    rank: int,
    values: dict[int, Any],
    stats: bytes,
    metas: dict[int, str],
) -> list[Any] | None:
    """:func:`own_done_frames` of ``Done(session, job, rank, values, stats, metas)`` (no
    names saved), packed from its fields without the record: for the job shell's inline
    runs, whose answer is packed as soon as it is known."""
    if len(stats) >= _INLINE_BYTES:  # a long blob travels in a frame: encode's
        return None
    for value in values.values():  # _plain(values, 1) unrolled; its keys are output indices
        t = type(value)
        if t in _ATOMS or (t is int and _INT_MIN <= value <= _INT_MAX):
            continue  # most outputs: no call
        if t is bytes and len(value) < _INLINE_BYTES:
            continue  # a short bytes value, as every sealed one (secure mode): no call
        if not _plain(value, 2):
            return None
    try:
        header: bytes = _tls.pack([_TAG, session, job, rank, values, stats, metas, []])
    except Exception:  # a string msgpack cannot encode, say: encode reports it
        _tls.pack = _packer()
        return None
    if len(header) > MAX_HEADER_BYTES:
        return None
    return [MAGIC_FRAME, header]


# msgpack's float64 mark (0xcb, then 8 bytes)
_F64 = 0xCB
_FIXINTS = tuple(bytes([n]) for n in range(128))  # 0..127: msgpack's positive fixint
_FIXSTRS = tuple(bytes([0xA0 | n]) for n in range(32))  # a str of 0..31 bytes' head
_FLOAT = struct.Struct(">Bd").pack
_ONE_VALUE = b"\x81\x00"  # values: a map of one, output 0
# a bytes value of at most this many bytes (a secure job's sealed scalar: a compact box of
# about 60) rides as a msgpack bin8, its head by table; under the codec's _INLINE_BYTES
_BIN8_MAX = 255
_BIN8_HEADS = tuple(bytes([0xC4, n]) for n in range(_BIN8_MAX + 1))


class OneSpanDone:
    """The ``Done`` frame of an inline run of one op on this rank whose one output is a
    scalar (``int``, ``float``, ``bool`` or None; in secure mode that scalar's compact box,
    ``bytes`` of at most 255, as the value): the bytes ``encode`` writes for
    ``Done(session, job, rank, values, stats, {0: meta}, [])`` with the stats blob
    ``pack_stats(run_s, started, [[op, label, start, end]])`` (``mpl.wire.run_stats``),
    joined from parts packed once per (session, rank, op, label) and a few per job, with
    no msgpack call for most jobs. :meth:`frame` says None for anything it does not pack
    (the caller then packs the fields): ``tests/test_done_frames.py`` compares the bytes.

    Raises ``ValueError`` (or msgpack's error) for a session or label that does not pack
    here (then the fields are packed each time)."""

    __slots__ = ("_floats", "_head", "_rank", "_span", "_stats", "_tails")

    def __init__(self, session: str, rank: int, op: int, label: str) -> None:
        pack = _packer()
        self._head = MAGIC_FRAME + b"\x98" + pack(_TAG) + pack(session)
        self._rank = pack(rank)
        span = pack(op) + pack(label)
        # the stats blob: [run_s, started, [[op, label, start, end]], 0], its floats float64
        size = 1 + 9 + 9 + 2 + len(span) + 9 + 9 + 1
        # the longest header it makes: a 31-byte job id, a bin8 value, a meta of 31 bytes
        longest = len(self._head) + 32 + len(self._rank) + 4 + _BIN8_MAX + size + 40
        if size >= _INLINE_BYTES or longest > MAX_HEADER_BYTES:
            raise ValueError("a Done too long to pack from a template")
        bin_head = b"\xc4" + bytes([size]) if size < 256 else b"\xc5" + size.to_bytes(2, "big")
        self._stats = bin_head + b"\x94\xcb"
        # run_s, 0xcb, started, the span's head (op and label), start, 0xcb, end
        middle = b"\x91\x94" + span + b"\xcb"
        self._span = middle
        self._floats = struct.Struct(f">dBd{len(middle)}sdBd").pack
        self._tails: dict[str, bytes] = {}  # by meta: the blob's end, the metas, saved

    def frame(
        self,
        job: str,
        value: Any,
        held: bool,
        meta: str,
        run_s: float,
        started: float,
        start: float,
        end: float,
    ) -> bytes | None:
        """The Done's one frame (wire v4: the magic and the header) for ``job``, whose output
        ``value`` (described as ``meta``) is in its values if ``held``; the run's seconds,
        its start on the wall clock and its op's span. None if a part does not pack here."""
        try:
            raw = job.encode()
        except UnicodeEncodeError:  # not UTF-8: encode says why
            return None
        if len(raw) >= 32:  # a long id: the fields' path
            return None
        if not held:
            packed = b"\x80"
        else:
            t = type(value)
            if t is int and 0 <= value < 128:
                packed = _ONE_VALUE + _FIXINTS[value]
            elif t is float:
                packed = _ONE_VALUE + _FLOAT(_F64, value)
            elif value is None:
                packed = b"\x81\x00\xc0"
            elif t is bool:
                packed = b"\x81\x00\xc3" if value else b"\x81\x00\xc2"
            elif t is bytes and len(value) <= _BIN8_MAX:  # a sealed value (secure mode)
                packed = b"".join((_ONE_VALUE, _BIN8_HEADS[len(value)], value))
            else:  # any other int, longer bytes: the fields' path
                return None
        tail = self._tails.get(meta)
        if tail is None:
            if len(meta) > 31 or len(self._tails) > 8:
                return None
            tail = self._tails[meta] = b"\x00" + _packer()({0: meta}) + b"\x90"
        return b"".join(
            (
                self._head,
                _FIXSTRS[len(raw)],
                raw,
                self._rank,
                packed,
                self._stats,
                self._floats(run_s, _F64, started, self._span, start, _F64, end),
                tail,
            )
        )


def _plain(obj: Any, depth: int) -> bool:
    """``obj`` holds only what msgpack packs exactly as the codec does: nothing the codec
    would wrap, pickle or hand to its extension types."""
    t = type(obj)
    if t in _ATOMS:
        return True
    if t is int:
        return bool(_INT_MIN <= obj <= _INT_MAX)
    if t is bytes:
        return len(obj) < _INLINE_BYTES  # longer ones travel in a frame of their own
    if depth >= _DEPTH:
        return False
    depth += 1
    # plain loops: all() over a generator costs a generator per list and dict
    if t is list:
        for item in obj:  # noqa: SIM110
            if not _plain(item, depth):
                return False
        return True
    if t is dict:
        for key, value in obj.items():  # noqa: SIM110
            if not (_plain(key, depth) and _plain(value, depth)):
                return False
        return True
    return False
