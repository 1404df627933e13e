"""Records in files: the same frames as on the wire, length-prefixed in one byte string.

Layout of a record: ``RECORD_MAGIC`` (``b"MPR"`` and the persisted format's version, its
own: the wire's ``VERSION`` may change without making stored files unreadable), then for
each frame of the record (its header, then its buffers) an 8-byte little-endian length and
its bytes. Files written before persisted records had their own version (wire version 1)
begin with that wire magic instead, and hold the wire magic again as their first frame;
``loads`` reads them too (:data:`LEGACY_MAGIC`).

``PERSIST_VERSION`` names the layouts of the records stored in files (``SymbolInfo``, and
``Lit`` with the safe values in it), which the codec then decodes: a change to those
layouts bumps it, and ``loads`` must go on reading the versions before.

Files hold the safe value format only (``mpl.wire.safe_values``), even in a trusted
cluster: ``dumps`` refuses other values with ``UnsafeValueError`` and ``loads`` refuses a
pickle (files written before mpl had the safe format) with ``ProtocolError``, unloaded.
``loads`` raises :class:`ProtocolError` for anything malformed, like ``decode``.

A persisted symbol is ONE file, so that it is published by one atomic rename::

    SYMBOL_MAGIC   b"MPS" + version byte
    8 bytes        little-endian length L of the description record
    L bytes        the description (a SymbolInfo record, as ``dumps`` writes it)
    the rest       the value (a Lit record, as ``dumps`` writes it)

The description comes first so that listing a data root reads a few bytes per name, never
the values.

A symbol a secure worker persists names its owner, the driver whose sealed job saved it
(``mpl.worker.symbol_owner``), in a layout of its own, version 2 of the magic::

    OWNED_SYMBOL_MAGIC  b"MPS" + 2
    2 bytes             little-endian length N of the owner (at most MAX_OWNER_BYTES)
    N bytes             the owner's identity, UTF-8 (never empty)
    then as version 1   8-byte length of the description, the description, the value

The owner is outside the description: a version 1 file (whose description anyone who
relayed a save may have written) never reads as owned. An mpl from before version 2 reports
an owned file as not a symbol file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, Any

from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.record import Record

__all__ = [
    "LEGACY_MAGIC",
    "MAX_DESCRIPTION_BYTES",
    "MAX_OWNER_BYTES",
    "OWNED_SYMBOL_MAGIC",
    "PERSIST_VERSION",
    "RECORD_MAGIC",
    "SYMBOL_MAGIC",
    "dumps",
    "loads",
    "read_owned_head",
    "read_symbol_head",
    "split_owned_symbol",
    "split_symbol",
    "symbol_chunks",
]

SYMBOL_MAGIC = b"MPS\x01"
OWNED_SYMBOL_MAGIC = b"MPS\x02"
MAX_OWNER_BYTES = 1024  # an identity is a driver's name in a cluster spec
MAX_DESCRIPTION_BYTES = 1 << 20  # a SymbolInfo is a name, ranks and a small meta dict
PERSIST_VERSION = 1
RECORD_MAGIC = b"MPR" + bytes([PERSIST_VERSION])
# What files written with wire version 1 (before PERSIST_VERSION) begin with, and their
# first frame: the records in them have persist version 1's layouts
LEGACY_MAGIC = b"MPL\x01"


def _chunks(msg: Record) -> Iterator[Any]:
    yield RECORD_MAGIC
    for frame in encode(msg, safe=True)[1:]:  # the wire's magic is not stored
        view = memoryview(frame)
        yield view.nbytes.to_bytes(8, "little")
        yield view


def dumps(msg: Record) -> bytes:
    return b"".join(bytes(c) if isinstance(c, memoryview) else c for c in _chunks(msg))


def loads(data: bytes | memoryview) -> Record:
    view = memoryview(data)
    magic = view[: len(RECORD_MAGIC)].tobytes()
    if magic != RECORD_MAGIC and magic != LEGACY_MAGIC:
        if magic[:3] == RECORD_MAGIC[:3] and len(magic) == len(RECORD_MAGIC):
            raise ProtocolError(
                f"persisted record of format version {magic[3]}: this mpl reads versions up "
                f"to {PERSIST_VERSION}"
            )
        raise ProtocolError("not an mpl persisted record (bad magic)")
    frames: list[memoryview] = []
    pos = len(RECORD_MAGIC)
    while pos < len(view):
        if pos + 8 > len(view):
            raise ProtocolError("truncated persisted record")
        size = int.from_bytes(view[pos : pos + 8], "little")
        pos += 8
        if pos + size > len(view):
            raise ProtocolError("truncated persisted record")
        frames.append(view[pos : pos + size])
        pos += size
    if magic == LEGACY_MAGIC:  # the wire's magic of then, kept as the first frame
        if not frames or frames[0].tobytes() != LEGACY_MAGIC:
            raise ProtocolError("not an mpl persisted record (bad inner magic)")
        frames = frames[1:]
    # the records' layouts are PERSIST_VERSION's (and version 1's, the same): the codec of
    # this wire version reads them
    return decode([MAGIC_FRAME, *frames], safe=True)


def symbol_chunks(info: Record, value: Record, owner: str = "") -> Iterator[Any]:
    """The bytes of a symbol file, in pieces to write one after the other (large arrays are
    not copied into one string); owned by ``owner`` if one is given (version 2), else
    version 1. Encoding happens first: an ``UnsafeValueError`` comes out of the first
    ``next()``, before anything is written."""
    head = dumps(info)
    body = list(_chunks(value))
    size = len(head).to_bytes(8, "little")
    if owner:
        who = owner.encode()
        if len(who) > MAX_OWNER_BYTES:
            raise ValueError(f"an owner of {len(who)} bytes exceeds {MAX_OWNER_BYTES}")
        yield OWNED_SYMBOL_MAGIC + len(who).to_bytes(2, "little") + who + size
    else:
        yield SYMBOL_MAGIC + size
    yield head
    yield from body


def read_owned_head(f: IO[bytes]) -> tuple[Record, str]:
    """The description at the start of an open symbol file, and its owner ("": none)."""
    magic = f.read(len(SYMBOL_MAGIC))
    owner = ""
    if magic == OWNED_SYMBOL_MAGIC:
        owner = _owner(f.read(2), f.read)
    size = _head_size(magic if magic != OWNED_SYMBOL_MAGIC else SYMBOL_MAGIC, f.read(8))
    head = f.read(size)
    if len(head) != size:
        raise ProtocolError("truncated symbol description")
    return loads(head), owner


def read_symbol_head(f: IO[bytes]) -> Record:
    """The description at the start of an open symbol file."""
    return read_owned_head(f)[0]


def split_owned_symbol(data: bytes | memoryview) -> tuple[Record, Record, str]:
    """(description, value, owner or "") of a whole symbol file."""
    view = memoryview(data)
    magic = view[: len(SYMBOL_MAGIC)].tobytes()
    start, owner = len(SYMBOL_MAGIC), ""
    if magic == OWNED_SYMBOL_MAGIC:
        rest = view[start:]
        owner = _owner(rest[:2].tobytes(), lambda n: rest[2 : 2 + n].tobytes())
        start += 2 + len(owner.encode())
        magic = SYMBOL_MAGIC
    size = _head_size(magic, view[start : start + 8].tobytes())
    start += 8
    if start + size > len(view):
        raise ProtocolError("truncated symbol description")
    return loads(view[start : start + size]), loads(view[start + size :]), owner


def split_symbol(data: bytes | memoryview) -> tuple[Record, Record]:
    """(description, value) of a whole symbol file."""
    info, value, _ = split_owned_symbol(data)
    return info, value


def _owner(length: bytes, read: Callable[[int], bytes]) -> str:
    """An owned file's owner, its 2-byte length read already (``read(n)``: its bytes)."""
    if len(length) != 2:
        raise ProtocolError("truncated symbol owner")
    size = int.from_bytes(length, "little")
    who = read(size)
    if not 0 < size <= MAX_OWNER_BYTES or len(who) != size:
        raise ProtocolError("a symbol file's owner is empty, too long or truncated")
    try:
        return who.decode()
    except UnicodeDecodeError:
        raise ProtocolError("a symbol file's owner is not UTF-8") from None


def _head_size(magic: bytes, size: bytes) -> int:
    if magic != SYMBOL_MAGIC or len(size) < 8:
        raise ProtocolError("not an mpl symbol file (bad magic or truncated)")
    length = int.from_bytes(size, "little")
    if length > MAX_DESCRIPTION_BYTES:
        raise ProtocolError(f"symbol description of {length} bytes exceeds {MAX_DESCRIPTION_BYTES}")
    return length
