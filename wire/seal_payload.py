"""The plaintext of a sealed payload (``mpl.wire.seal``): a ``sealed-value`` record
holding the value, encoded by the codec; and its fast paths.

The smallest payloads (None, sealed on every job for each rank without inputs; a bool, a
64-bit int, a float or a short str: most inline results) skip the codec's walk on both
sides. Their plaintext is byte for byte what the codec writes (checked at import), so
either side may take either path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from mpl.wire.codec import MAGIC_FRAME, encode
from mpl.wire.record import Record

__all__ = [
    "FIXINT_FRAMES",
    "NOT_ONE_BYTE",
    "ONE_BYTE_VALUES",
    "Payload",
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

for _sample in (None, True, False, -32, -1, 0, 127, 128, 1 << 63, -(1 << 63), 0.5, "text"):
    # the two paths agree (at the table's ends and both sides of them too)
    if scalar_frames(_sample) != encode(Payload(_sample)):
        raise ImportError(
            f"mpl.wire.seal_payload: the scalar path differs from the codec's at {_sample!r}"
        )
    _read = ONE_BYTE_VALUES.get(encode(Payload(_sample))[1], NOT_ONE_BYTE)
    _in_table = _sample in (None, True, False, -32, -1, 0, 127) and type(_sample) is not float
    if (_read, type(_read)) != ((_sample, type(_sample)) if _in_table else (NOT_ONE_BYTE, object)):
        raise ImportError(f"mpl.wire.seal_payload: the one-byte table misreads {_sample!r}")
