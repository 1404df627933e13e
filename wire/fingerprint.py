"""A fixed-size fingerprint of a value decoded from the wire, to find an equal one by hash.

Tables that keep one copy of equal values (a worker's sessions' runtime_info, a broker's
sessions' specs) must find an equal copy without comparing against every copy kept: a
sender can make thousands of values of one size and shape that differ in one character,
and a search by comparison then costs the square of their number. Python's own hash of
such values is no way out either: integers hash to what the sender chooses.

:func:`fingerprint` is BLAKE2b-256 over an encoding of the value that is injective over
the types a safe decode gives (None, bool, int, float, str, bytes, list, tuple, dicts of
them, and subclasses of those scalars such as numpy's, named by their type): every item
carries its type and, where it varies, its length, so no two different values encode the
same. Equal fingerprints therefore mean equal values of the
same types, maps in the same order (up to a collision of BLAKE2b-256): what a session
gets from a copy kept for another is what it sent, down to what a kernel can see (a
map's order, a value's type). So values that compare equal across types (``1``, ``1.0``
and ``True``; a numpy ``float64`` or ``str_`` and the float or str it equals, which
subclass them) get different fingerprints, and so do equal maps in another order: they
are only not shared.

Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

__all__ = ["MAX_FINGERPRINT_DEPTH", "fingerprint"]

# deeper than any cluster spec or runtime_info needs (the wire lets values nest up to
# limits.MAX_NESTING, 100, in each extension); bounds the recursion
MAX_FINGERPRINT_DEPTH = 64


class _Unknown(Exception):
    """A value of a type the encoding does not cover."""


def fingerprint(value: Any) -> bytes | None:
    """32 bytes naming ``value`` (see above), or None if it holds a type not covered or
    nests deeper than :data:`MAX_FINGERPRINT_DEPTH` (a caller then keeps it unshared, or
    refuses it)."""
    try:
        encoded = _encode(value, 0)
    except _Unknown:
        return None
    return hashlib.blake2b(encoded, digest_size=32).digest()


def _encode(value: Any, depth: int) -> bytes:
    if depth > MAX_FINGERPRINT_DEPTH:
        raise _Unknown
    if value is None:
        return b"N"
    if value is True:
        return b"T"
    if value is False:
        return b"F"
    kind = type(value)  # exact types: a subclass is named below
    if kind is int:
        return b"I%x;" % value  # any size, its sign included
    if kind is float:
        return b"D" + struct.pack("<d", value)
    if kind is str:
        text = value.encode("utf-8", "surrogatepass")
        return b"S%d:%s" % (len(text), text)
    if kind is bytes:
        return b"B%d:%s" % (len(value), value)
    if kind is list or kind is tuple:
        tag = b"L" if kind is list else b"U"
        return b"%s%d:%s" % (tag, len(value), b"".join(_encode(v, depth + 1) for v in value))
    if kind is dict:
        # in the map's own order: equal maps in another order are not shared (a session
        # would see another's order, and learn that another session sent the same)
        entries = b"".join(_encode(k, depth + 1) + _encode(v, depth + 1) for k, v in value.items())
        return b"M%d:%s" % (len(value), entries)
    for base in _SCALARS:
        if isinstance(value, base):
            # a subclass (numpy's float64, str_ and bytes_ are float's, str's and bytes')
            # equals its base's value but is not the same to a kernel that looks at it:
            # its type's name first (the types a decode makes have names of their own)
            name = f"{kind.__module__}.{kind.__qualname__}".encode("utf-8", "surrogatepass")
            return b"X%d:%s%s" % (len(name), name, _encode(base(value), depth + 1))
    raise _Unknown


_SCALARS: tuple[type[Any], ...] = (int, float, str, bytes)
