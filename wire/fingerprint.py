"""A fixed-size fingerprint of a value decoded from the wire, to find an equal one by hash.

Tables that keep one copy of equal values (a worker's sessions' runtime_info, a broker's
sessions' specs) must find an equal copy without comparing against every copy kept: a
sender can make thousands of values of one size and shape that differ in one character,
and a search by comparison then costs the square of their number. Python's own hash of
such values is no way out either: integers hash to what the sender chooses.

:func:`fingerprint` is BLAKE2b-256 over an encoding of the value that is injective over
the types a safe decode gives (None, bool, int, float, str, bytes, list, tuple, and maps
of them): every item carries its type and, where it varies, its length, so no two
different values encode the same, and a map's entries are sorted by their encoding, so
equal maps in any order encode the same. Equal fingerprints therefore mean equal values
(up to a collision of BLAKE2b-256). Values that compare equal across types (``1``,
``1.0`` and ``True``) get different fingerprints: they are only not shared.

Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

__all__ = ["fingerprint"]

_MAX_DEPTH = 64  # deeper than any value the wire's limits let through


class _Unknown(Exception):
    """A value of a type the encoding does not cover."""


def fingerprint(value: Any) -> bytes | None:
    """32 bytes naming ``value`` (see above), or None if it holds a type not covered (a
    caller then keeps it unshared)."""
    try:
        encoded = _encode(value, 0)
    except _Unknown:
        return None
    return hashlib.blake2b(encoded, digest_size=32).digest()


def _encode(value: Any, depth: int) -> bytes:
    if depth > _MAX_DEPTH:
        raise _Unknown
    if value is None:
        return b"N"
    if value is True:
        return b"T"
    if value is False:
        return b"F"
    if isinstance(value, int):
        return b"I%x;" % value  # any size, its sign included
    if isinstance(value, float):
        return b"D" + struct.pack("<d", value)
    if isinstance(value, str):
        text = value.encode("utf-8", "surrogatepass")
        return b"S%d:%s" % (len(text), text)
    if isinstance(value, bytes):
        return b"B%d:%s" % (len(value), value)
    if isinstance(value, (list, tuple)):
        tag = b"L" if isinstance(value, list) else b"U"
        return b"%s%d:%s" % (tag, len(value), b"".join(_encode(v, depth + 1) for v in value))
    if isinstance(value, Mapping):
        entries = sorted(_encode(k, depth + 1) + _encode(v, depth + 1) for k, v in value.items())
        return b"M%d:%s" % (len(entries), b"".join(entries))
    raise _Unknown
