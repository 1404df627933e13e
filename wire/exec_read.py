"""The worker's decoder for what the broker sends: ``Exec`` read in one pass over its bytes.

A worker decodes one ``Exec`` per job, and nearly every one has the same plain shape: the
tag, three short strings, a tuple of ranks, the rank's bindings (none; or its sealed box in
secure mode; or store names), a tuple of inline outputs and a float. The general
:func:`mpl.wire.codec.decode` reads it through a ``Decoder``, a Python call per tuple and
a check per field compiled from the annotations. Here that one shape is read at known
positions, byte by byte, and everything else goes to ``decode`` unchanged.

It accepts only what ``decode`` accepts, and builds the same record: exactly two frames
(no buffer frames), the magic frame, the header size limit, strict UTF-8 strings, tuples
of small non-negative ints (the same shape the ``Decoder`` reads without a nested unpack),
int map keys, and the header read to its last byte. Nothing here can run code (no pickle is
ever read: any extension but a tuple sends the message to ``decode``, which applies the safe
format). Whenever a byte is not the expected one, the message is handed to ``decode``,
which accepts it or says why not: the refusals are always ``decode``'s own.
``tests/test_exec_read.py`` compares both on valid and thousands of mutated messages.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Any

from zmq import Frame

from mpl.wire.codec import MAGIC_FRAME, decode
from mpl.wire.decoder import TUPLE
from mpl.wire.jobs import Exec
from mpl.wire.limits import MAX_HEADER_BYTES
from mpl.wire.record import Record

__all__ = ["read_broker_message", "read_exec"]

_FIELDS = ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s")
# The fields are read one by one below: a changed Exec must change this reader too.
if tuple(f.name for f in dataclasses.fields(Exec)) != _FIELDS:
    raise ImportError("mpl.wire.exec_read: Exec's fields changed; update this reader")
# a fixarray of the tag and seven fields, then the tag as a fixstr
_PREFIX = bytes([0x90 | (1 + len(_FIELDS)), 0xA0 | len(Exec.TAG)]) + Exec.TAG.encode()
_START = len(_PREFIX)
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}  # fixext n: payload size
_DOUBLE = struct.Struct(">d")


class _Other(Exception):
    """Not the plain shape read here: the message goes to ``decode``."""


def read_broker_message(frames: Sequence[Any], *, safe: bool) -> Record:
    """``decode(frames, safe=safe)``, on the lean path for a plain ``Exec``; raises
    ProtocolError for anything malformed, as ``decode`` does."""
    rec = read_exec(frames)
    return rec if rec is not None else decode(frames, safe=safe)


def read_exec(frames: Sequence[Any]) -> Exec | None:
    """The ``Exec`` that ``decode(frames)`` returns, when the message has the plain shape
    this module reads; None for anything else (then ``decode`` has the last word). The
    result does not depend on safe mode: the plain shape holds no pickle."""
    if len(frames) != 2:
        return None
    try:
        magic, header = _bytes(frames[0]), _bytes(frames[1])
    except TypeError:
        return None
    if magic != MAGIC_FRAME or len(header) > MAX_HEADER_BYTES or not header.startswith(_PREFIX):
        return None
    try:
        session, at = _str(header, _START)
        job, at = _str(header, at)
        digest, at = _str(header, at)
        ranks, at = _tuple(header, at)
        bindings, at = _bindings(header, at)
        inline, at = _tuple(header, at)
        timeout_s, at = _number(header, at)
    except (_Other, IndexError, UnicodeDecodeError):
        return None
    if at != len(header):
        return None
    msg = object.__new__(Exec)
    msg.__dict__.update(
        session=session, job=job, digest=digest, ranks=ranks, bindings=bindings,
        inline=inline, timeout_s=timeout_s,
    )  # fmt: skip
    return msg


def _bytes(frame: Any) -> bytes:
    """A frame's bytes: ``zmq.Frame.bytes``, else its buffer's."""
    if type(frame) is Frame:
        data: bytes = frame.bytes
        return data
    return memoryview(frame).tobytes()  # TypeError for what is not a buffer, as decode's


def _str(h: bytes, at: int) -> tuple[str, int]:
    """A msgpack str at ``at`` (fixstr, str8 or str16), decoded as strict UTF-8."""
    b = h[at]
    if 0xA0 <= b <= 0xBF:
        start, n = at + 1, b & 0x1F
    elif b == 0xD9:
        start, n = at + 2, h[at + 1]
    elif b == 0xDA:
        start, n = at + 3, (h[at + 1] << 8) | h[at + 2]
    else:
        raise _Other
    end = start + n
    if end > len(h):
        raise _Other
    return h[start:end].decode(), end


def _bin(h: bytes, at: int) -> tuple[bytes, int]:
    b = h[at]
    if b == 0xC4:
        start, n = at + 2, h[at + 1]
    elif b == 0xC5:
        start, n = at + 3, (h[at + 1] << 8) | h[at + 2]
    else:
        raise _Other
    end = start + n
    if end > len(h):
        raise _Other
    return h[start:end], end


def _tuple(h: bytes, at: int) -> tuple[tuple[int, ...], int]:
    """A TUPLE extension holding a fixarray of positive fixints (what the ``Decoder`` reads
    without a nested unpack): ranks, output indexes."""
    b = h[at]
    size = _FIXEXT.get(b)
    if size is not None:
        code_at = at + 1
    elif b == 0xC7:
        size, code_at = h[at + 1], at + 2
    else:
        raise _Other
    if h[code_at] != TUPLE:
        raise _Other
    start = code_at + 1
    end = start + size
    n = size - 1
    if end > len(h) or n >= 16 or h[start] != 0x90 | n:
        raise _Other
    items = h[start + 1 : end]
    if n and max(items) >= 0x80:
        raise _Other
    return tuple(items), end


def _bindings(h: bytes, at: int) -> tuple[dict[int, Any], int]:
    """A fixmap from small ranks to a sealed box (bin) or a list of store names and Nones."""
    b = h[at]
    if not 0x80 <= b <= 0x8F:
        raise _Other
    at += 1
    bindings: dict[int, Any] = {}
    for _ in range(b & 0x0F):
        rank = h[at]
        if rank >= 0x80:
            raise _Other
        at += 1
        kind = h[at]
        if 0x90 <= kind <= 0x9F:
            at += 1
            row: list[Any] = []
            for _ in range(kind & 0x0F):
                if h[at] == 0xC0:
                    row.append(None)
                    at += 1
                else:
                    name, at = _str(h, at)
                    row.append(name)
            bindings[rank] = row
        else:
            bindings[rank], at = _bin(h, at)
    return bindings, at


def _number(h: bytes, at: int) -> tuple[float, int]:
    """A float64, or a positive fixint (a float field accepts an int, as ``decode`` does)."""
    b = h[at]
    if b == 0xCB:
        end = at + 9
        if end > len(h):
            raise _Other
        value: float = _DOUBLE.unpack_from(h, at + 1)[0]
        return value, end
    if b < 0x80:
        return b, at + 1
    raise _Other
