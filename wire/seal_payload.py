"""The plaintext of a sealed payload (``mpl.wire.seal``): a ``sealed-value`` record
holding the value, encoded by the codec; and its fast paths.

The smallest payloads (None, sealed on every job for each rank without inputs; a bool, a
64-bit int, a float or a short str: most inline results) skip the codec's walk on both
sides. In a ``Sealed`` record their plaintext is byte for byte what the codec writes
(checked at import), so either side may take either path.

In a compact box such a scalar's plaintext is its msgpack bytes alone (:func:`raw_scalar`:
one byte for a small int, not the record's 15): every byte a box carries is one more byte
for CurveZMQ to encrypt and authenticate at both ends of every hop. The two forms cannot be
taken for one another: the codec's header is a msgpack array (its lead byte 0x90-0x9f or
0xdc-0xdd), and a raw scalar's lead byte is never one (:func:`read_raw` reads only those).

Reading an authenticated plaintext back into its value (:func:`payload_value`,
:func:`box_value`) and checking a payload's buffers (:func:`flat_size`, :func:`flat_view`)
are here too, for ``mpl.wire.seal`` and the driver's result opener alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.record import Record

__all__ = [
    "FIXINT_FRAMES",
    "NOT_ONE_BYTE",
    "ONE_BYTE_VALUES",
    "RAW_FIXINT",
    "RAW_ONE_BYTE",
    "Payload",
    "box_value",
    "flat_size",
    "flat_view",
    "payload_value",
    "raw_scalar",
    "read_raw",
    "read_scalar",
    "scalar_frames",
]


@dataclass(eq=False, repr=False)
class Payload(Record, tag="sealed-value"):
    value: Any


# The smallest payloads (None, sealed on every job for each rank without inputs; a bool, a
# 64-bit int, a float or a short str: most inline results) skip the codec's walk on both
# sides. Their plaintext is byte for byte what the codec writes (checked below, at import),
# so either side may take either path.
_NONE_FRAMES = encode(Payload(None))
_PAYLOAD_HEAD = _NONE_FRAMES[1][: -len(msgpack.packb(None))]
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_SHORT_STR = 32  # a msgpack fixstr: its one lead byte says it is a str
# lead bytes of those values: fixint, nil, bool, float64, (u)int8-64, fixstr, negative fixint
_SCALAR_LEADS = frozenset(
    (*range(0x00, 0x80), 0xC0, 0xC2, 0xC3, 0xCB, *range(0xCC, 0xD4), *range(0xA0, 0xC0))
) | frozenset(range(0xE0, 0x100))


def scalar_frames(value: Any) -> list[Any] | None:
    """The payload frames of a small scalar without the codec, or None for anything else."""
    if value is None:
        return _NONE_FRAMES
    t = type(value)
    if t is int and -32 <= value < 128:  # the commonest results: one msgpack byte, no call
        return FIXINT_FRAMES[value]
    if t is bool:
        return _TRUE_FRAMES if value else _FALSE_FRAMES
    if (
        (t is int and _INT_MIN <= value <= _INT_MAX)
        or t is float
        or (t is str and len(value) < _SHORT_STR // 4)
    ):
        return [MAGIC_FRAME, _PAYLOAD_HEAD + msgpack.packb(value)]
    return None


def read_scalar(header: bytes) -> tuple[bool, Any]:
    """``(True, value)`` when an authenticated plaintext holds one small scalar, read
    without the codec; ``(False, None)`` sends it down the codec's path."""
    rest = header[len(_PAYLOAD_HEAD) :]
    if not header.startswith(_PAYLOAD_HEAD) or not rest or rest[0] not in _SCALAR_LEADS:
        return False, None
    try:
        value = msgpack.unpackb(rest)
    except (ValueError, msgpack.UnpackException):  # extra bytes, bad UTF-8, cut short:
        return False, None  # the codec says why
    return type(value) in (int, float, bool, str, type(None)), value


def raw_scalar(value: Any) -> bytes | None:
    """A compact box's plaintext for a small scalar (the types :func:`scalar_frames` takes):
    its msgpack bytes alone; None for anything else (sealed in the codec's form)."""
    t = type(value)
    if t is int and -32 <= value < 128:  # the commonest results: no call
        return RAW_FIXINT[value]
    if (
        value is None
        or t is bool
        or (t is int and _INT_MIN <= value <= _INT_MAX)
        or t is float
        or (t is str and len(value) < _SHORT_STR // 4)
    ):
        packed: bytes = msgpack.packb(value)
        return packed
    return None


def read_raw(plain: bytes) -> tuple[bool, Any]:
    """``(True, value)`` when an authenticated compact box's plaintext is a raw scalar
    (:func:`raw_scalar`), ``(False, None)`` when it is the codec's header (a msgpack
    array); ``ProtocolError`` for a raw scalar that does not read as exactly one."""
    if not plain or plain[0] not in _SCALAR_LEADS:
        return False, None
    try:
        value = msgpack.unpackb(plain)
    except (ValueError, msgpack.UnpackException):  # extra bytes, bad UTF-8, cut short
        raise ProtocolError("a sealed scalar does not read as one msgpack value") from None
    if type(value) not in (int, float, bool, str, type(None)):  # (the leads allow no other)
        raise ProtocolError(f"a sealed scalar reads as a {type(value).__name__}")
    return True, value


def _one_byte_frames(value: Any) -> list[Any]:
    return [MAGIC_FRAME, _PAYLOAD_HEAD + msgpack.packb(value)]


# Payloads whose value is one msgpack byte (None, a bool, a fixint), sealed and opened by a
# table lookup: the plaintext -> value table maps whole plaintexts, so only these exact
# bytes take it (True and 1 differ in their byte, so the table keeps them apart).
FIXINT_FRAMES = {v: _one_byte_frames(v) for v in range(-32, 128)}
_TRUE_FRAMES, _FALSE_FRAMES = _one_byte_frames(True), _one_byte_frames(False)
ONE_BYTE_VALUES: dict[bytes, Any] = {
    frames[1]: value
    for value, frames in [
        (None, _NONE_FRAMES),
        (True, _TRUE_FRAMES),
        (False, _FALSE_FRAMES),
        *FIXINT_FRAMES.items(),
    ]
}
NOT_ONE_BYTE = object()
# a compact box's one-byte plaintexts (raw_scalar's) -> their values, read by a lookup
RAW_FIXINT: dict[int, bytes] = {v: msgpack.packb(v) for v in range(-32, 128)}
RAW_ONE_BYTE: dict[bytes, Any] = {
    msgpack.packb(value): value for value in (None, True, False, *range(-32, 128))
}

for _sample in (None, True, False, -32, -1, 0, 127, 128, 1 << 63, -(1 << 63), 0.5, "text"):
    # a raw scalar reads back as itself, by the table or read_raw, and never as the codec's
    _raw = raw_scalar(_sample)
    _back = RAW_ONE_BYTE.get(_raw, NOT_ONE_BYTE) if _raw is not None else NOT_ONE_BYTE
    if _back is NOT_ONE_BYTE and _raw is not None:
        _back = read_raw(_raw)[1]
    if _raw is None or (_back, type(_back)) != (_sample, type(_sample)):
        raise ImportError(f"mpl.wire.seal_payload: the raw scalar path misreads {_sample!r}")
    if read_raw(encode(Payload(_sample))[1])[0]:
        raise ImportError("mpl.wire.seal_payload: a codec header reads as a raw scalar")
    # the two paths agree (at the table's ends and both sides of them too)
    if scalar_frames(_sample) != encode(Payload(_sample)):
        raise ImportError(
            f"mpl.wire.seal_payload: the scalar path differs from the codec's at {_sample!r}"
        )
    _read = ONE_BYTE_VALUES.get(encode(Payload(_sample))[1], NOT_ONE_BYTE)
    _in_table = _sample in (None, True, False, -32, -1, 0, 127) and type(_sample) is not float
    if (_read, type(_read)) != ((_sample, type(_sample)) if _in_table else (NOT_ONE_BYTE, object)):
        raise ImportError(f"mpl.wire.seal_payload: the one-byte table misreads {_sample!r}")


def payload_value(who: str, frames: list[Any], safe: bool, unpickle: bool) -> Any:
    """The value inside an authenticated payload's plaintext frames (a one-byte or short
    scalar by table, anything else through the codec, which must hold a :class:`Payload`);
    ``who`` sealed it, for the errors."""
    if len(frames) == 2:
        value = ONE_BYTE_VALUES.get(frames[1], NOT_ONE_BYTE)
        if value is not NOT_ONE_BYTE:
            return value
        done, value = read_scalar(frames[1])
        if done:
            return value
    try:
        payload = decode(frames, safe=safe, unpickle=unpickle)
    except ProtocolError as exc:
        raise ProtocolError(f"a payload sealed by {who}: {exc}") from None
    if not isinstance(payload, Payload):
        raise ProtocolError(f"a payload sealed by {who} holds a {payload.TAG!r} record")
    return payload.value


def box_value(who: str, plain: bytes, safe: bool, unpickle: bool) -> Any:
    """The value in an authenticated compact box's plaintext: a raw scalar
    (:func:`raw_scalar`) or the codec's header."""
    try:
        done, value = read_raw(plain)
    except ProtocolError as exc:
        raise ProtocolError(f"a payload sealed by {who}: {exc}") from None
    if done:
        return value
    return payload_value(who, [MAGIC_FRAME, plain], safe, unpickle)


def flat_size(part: Any) -> int:
    """The size of ``part``, a flat contiguous buffer of bytes (bytes, bytearray, a received
    frame's view); -1 for any other buffer; TypeError for what is no buffer."""
    view = memoryview(part)
    if view.ndim != 1 or view.format != "B" or not view.c_contiguous:
        return -1
    return view.nbytes


def flat_view(buf: Any) -> memoryview:
    """``buf`` as a flat view of bytes (a copy only for a buffer that is not contiguous)."""
    view = memoryview(buf)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    return view
