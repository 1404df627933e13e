"""Where a msgpack bin's bytes lie in a buffer, read from its head by hand.

For readers that slice bins out of a received frame without asking msgpack to read them:
msgpack would build whatever a hostile peer put there (arrays nested in arrays: a list per
byte) before a check could refuse it. A batch's headers (``mpl.wire.batch``) and a sealed
Exec's boxes (``mpl.wire.sealed_exec``) are read this way.
"""

from __future__ import annotations

__all__ = ["BIN8", "BIN16", "BIN32", "bin_bounds"]

BIN8, BIN16, BIN32 = 0xC4, 0xC5, 0xC6  # msgpack's bin markers: 1, 2 or 4 length bytes


def bin_bounds(data: bytes, at: int, widest: int = BIN32) -> tuple[int, int] | None:
    """``(start, stop)`` of the bytes of the msgpack bin whose head is at ``data[at]``: a
    bin8, a bin16 or (unless ``widest`` is narrower) a bin32 head that lies whole within
    ``data``; None for anything else there. ``stop`` may lie past the end of ``data``: what
    a bin cut short means is the caller's to say."""
    size = len(data)
    mark = data[at] if at < size else -1
    if mark == BIN8 and at + 2 <= size:
        return at + 2, at + 2 + data[at + 1]
    if mark == BIN16 and widest != BIN8 and at + 3 <= size:
        return at + 3, at + 3 + int.from_bytes(data[at + 1 : at + 3], "big")
    if mark == BIN32 and widest == BIN32 and at + 5 <= size:
        return at + 5, at + 5 + int.from_bytes(data[at + 1 : at + 5], "big")
    return None
