"""Exec frames on the driver's hot path: the same bytes as ``encode``, a fraction of the work
(and the frames of the batched ``Delete`` that frees the jobs' outputs, the same way).

A driver sends one ``Exec`` per job, and most of its header repeats from job to job: the
tag and session, the program's digest and ranks, the inline outputs and the time limit.
:func:`exec_frames` packs those parts once (kept in a small per-thread table) and packs
only the job id and the bindings per call, without the general encoder's walk over the
whole record. The frames are byte for byte what :func:`mpl.wire.codec.encode` writes
(``tests/test_exec_pack.py`` compares them), so every receiver decodes and checks them as
before: this saves the sender's work only, never a receiver's check.

Only plain bindings take this path: store URIs, ``None``, and ``Lit`` holding ``None``, a
``bool``, a ``float``, a ``str`` or a 64-bit ``int``; in secure mode, a rank's compact sealed
box (short ``bytes``). Anything else (arrays, pickles, ``Sealed`` records) goes through
``encode``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgpack

from mpl.wire.codec import _INLINE_BYTES, MAGIC_FRAME, MAX_HEADER_BYTES, encode
from mpl.wire.data import Delete
from mpl.wire.decoder import RECORD, TUPLE
from mpl.wire.jobs import Exec, Lit

__all__ = ["delete_frames", "exec_frames", "exec_parts", "pack_bindings"]

_PARTS = 64  # (session, digest, ranks, inline, timeout) combinations kept per thread
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_PLAIN = frozenset({str, float, bool, type(None)})
_LIT = Lit.TAG
_EMPTY_MAP = msgpack.packb({})
_STR = frozenset({str})


class _Parts(threading.local):
    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True, strict_types=True, autoreset=True)
        self.cache: dict[tuple[Any, ...], tuple[bytes, bytes, bytes]] = {}


_tls = _Parts()


def exec_frames(msg: Exec) -> list[Any]:
    """``encode(msg)``: the frames of ``msg``, packed from cached parts when its bindings
    are plain (see the module docstring)."""
    tls = _tls
    pack = tls.packer.pack
    # no bindings (a job without inputs): the empty map, without the walk
    plain = msg.bindings
    bindings = _EMPTY_MAP if type(plain) is dict and not plain else _pack_bindings(plain, pack)
    if bindings is None:
        return encode(msg)
    key = (msg.session, msg.digest, msg.ranks, msg.inline, msg.timeout_s)
    parts = tls.cache.get(key)
    if parts is None:
        parts = _parts(msg)
        if parts is None:
            return encode(msg)
        if len(tls.cache) >= _PARTS:
            tls.cache.clear()
        tls.cache[key] = parts
    head, middle, tail = parts
    header = b"".join((head, pack(msg.job), middle, bindings, tail))
    if len(header) > MAX_HEADER_BYTES:
        return encode(msg)  # which raises, saying why
    return [MAGIC_FRAME, header]


def _parts(msg: Exec) -> tuple[bytes, bytes, bytes] | None:
    """The packed header around the job id and the bindings, or None if not all plain."""
    return exec_parts(msg.session, msg.digest, msg.ranks, msg.inline, msg.timeout_s)


def exec_parts(
    session: Any, digest: Any, ranks: tuple[Any, ...], inline: tuple[Any, ...], timeout_s: Any
) -> tuple[bytes, bytes, bytes] | None:
    """``(head, middle, tail)``: an Exec's header is ``head + pack(job) + middle +
    pack_bindings(bindings) + tail``, byte for byte what ``encode`` writes; None unless
    these fields are plain (str, 64-bit ints, a float time limit)."""
    if type(timeout_s) is not float or not _plain_ints(ranks + inline):
        return None
    if type(session) is not str or type(digest) is not str:
        return None
    pack = _tls.packer.pack
    head = b"\x98" + pack(Exec.TAG) + pack(session)  # fixarray of tag and 7 fields
    middle = pack(digest) + _tuple(ranks)
    tail = _tuple(inline) + pack(timeout_s)
    return head, middle, tail


def _tuple(items: tuple[int, ...]) -> bytes:
    pack = _tls.packer.pack
    packed: bytes = pack(msgpack.ExtType(TUPLE, pack(list(items))))
    return packed


def _plain_ints(items: tuple[Any, ...]) -> bool:
    return all(type(i) is int and _INT_MIN <= i <= _INT_MAX for i in items)


def _pack_bindings(bindings: Any, pack: Callable[[Any], bytes] | None = None) -> bytes | None:
    """The packed bindings map, or None when some binding needs the general encoder.

    Packed as they are when no ``Lit`` needs its extension (a job's store URIs, a secure
    job's boxes); otherwise from a copy holding the extensions. ``pack``: this thread's
    packer's, when the caller has it."""
    if type(bindings) is not dict:
        return None
    if pack is None:
        pack = _tls.packer.pack
    lits = False
    # the checks are written out in the loop: a helper and its generator were four
    # Python calls per Exec (a secure Exec has a box for every rank)
    for rank, row in bindings.items():
        if type(rank) is not int or not _INT_MIN <= rank <= _INT_MAX:
            return None
        if type(row) is bytes:
            if len(row) >= _INLINE_BYTES:  # a sealed box (secure mode) travels inline, as bin
                return None
            continue
        if type(row) is not list:
            return None
        for item in row:
            t = type(item)
            if t is Lit:
                lits = True
            elif t is not str and item is not None:
                return None
    if not lits:
        return pack(bindings)
    plain: dict[int, Any] = {}
    for rank, row in bindings.items():
        if type(row) is bytes:
            plain[rank] = row
            continue
        items: list[Any] = []
        for item in row:
            if type(item) is Lit:
                lit = _lit(item.value)
                if lit is None:
                    return None
                items.append(lit)
            else:
                items.append(item)
        plain[rank] = items
    return pack(plain)


pack_bindings = _pack_bindings  # for a caller that packs an Exec from exec_parts


def _lit(value: Any) -> msgpack.ExtType | None:
    t = type(value)
    if t in _PLAIN or (t is int and _INT_MIN <= value <= _INT_MAX):
        return msgpack.ExtType(RECORD, _tls.packer.pack([_LIT, value]))
    return None


def delete_frames(session: str, uris: dict[int, list[str]]) -> list[Any]:
    """``encode(Delete(session, uris))`` when the URIs are plain (int ranks, lists of str):
    one msgpack call instead of building the record and the general encoder's walk over
    every URI. A list that serves several ranks (``Context.flush`` gives every rank of a
    value one list) is checked once, and when one list serves them all it is packed once:
    the work is per URI, not per URI and rank."""
    if type(session) is not str or type(uris) is not dict or not _plain_ints(tuple(uris)):
        return encode(Delete(session, uris))
    checked: list[str] | None = None  # the last list checked
    lists = 0  # distinct lists in a row
    for row in uris.values():
        if row is checked:
            continue
        if type(row) is not list or not set(map(type, row)) <= _STR:  # no Python call per URI
            return encode(Delete(session, uris))
        checked = row
        lists += 1
    pack = _tls.packer.pack
    if lists == 1 and checked is not None and len(uris) > 1:
        # the map written out: each rank packed, then the one list's bytes after each
        row = pack(checked)
        body = _map_head(len(uris)) + row.join(map(pack, uris)) + row
    else:
        body = pack(uris)
    header = b"\x93" + pack(Delete.TAG) + pack(session) + body  # tag and 2 fields
    if len(header) > MAX_HEADER_BYTES:
        return encode(Delete(session, uris))  # which raises, saying why
    return [MAGIC_FRAME, header]


def _map_head(n: int) -> bytes:
    """msgpack's header of a map of ``n`` entries (fixmap, map 16, map 32)."""
    if n < 16:
        return bytes((0x80 | n,))
    if n < 1 << 16:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")
