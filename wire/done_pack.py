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

import threading
from typing import Any

import msgpack

from mpl.wire.codec import _INLINE_BYTES, MAGIC_FRAME, MAX_HEADER_BYTES
from mpl.wire.jobs import Done
from mpl.wire.record import pinned_fields

__all__ = ["done_frames", "own_done_fields", "own_done_frames"]

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
