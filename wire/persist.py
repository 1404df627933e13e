"""Records in files: the same frames as on the wire, length-prefixed in one byte string.

Layout: ``MAGIC_FRAME``, then for each frame an 8-byte little-endian length and its bytes.
Files hold the safe value format only (``mpl.wire.safe_values``), even in a trusted
cluster: ``dumps`` refuses other values with ``UnsafeValueError`` and ``loads`` refuses a
pickle (files written before mpl had the safe format) with ``ProtocolError``, unloaded.
``loads`` raises :class:`ProtocolError` for anything malformed, like ``decode``.
"""

from __future__ import annotations

from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.record import Record

__all__ = ["dumps", "loads"]


def dumps(msg: Record) -> bytes:
    parts = [MAGIC_FRAME]
    for frame in encode(msg, safe=True):
        view = memoryview(frame)
        parts.append(view.nbytes.to_bytes(8, "little"))
        parts.append(view.tobytes() if not isinstance(frame, bytes) else frame)
    return b"".join(parts)


def loads(data: bytes | memoryview) -> Record:
    view = memoryview(data)
    if view[: len(MAGIC_FRAME)].tobytes() != MAGIC_FRAME:
        raise ProtocolError("not an mpl persisted record (bad magic)")
    frames: list[memoryview] = []
    pos = len(MAGIC_FRAME)
    while pos < len(view):
        if pos + 8 > len(view):
            raise ProtocolError("truncated persisted record")
        size = int.from_bytes(view[pos : pos + 8], "little")
        pos += 8
        if pos + size > len(view):
            raise ProtocolError("truncated persisted record")
        frames.append(view[pos : pos + size])
        pos += size
    return decode(frames, safe=True)
