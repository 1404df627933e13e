"""The broker's reading of a sender's repeated sealed Exec by comparison
(``mpl.wire.sealed_exec.SealedExecReaders``): it must answer exactly what the full read
(``read_sealed_exec``) answers, for every frame, the repeat path taken or not: the same
``Exec``, header bytes and boxes, or a ``ProtocolError`` where the full read raises one.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from mpl.wire.codec import encode
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Exec
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, SealedExecReaders, read_sealed_exec

BOX = b"MB\x05" + bytes(range(70))  # a compact box's length (never opened here)
pack = msgpack.packb
_SESSION = "s" + "5" * 16 + "~" + "6" * 16


def _header(job: str, **fields: Any) -> bytes:
    base: dict[str, Any] = {
        "session": _SESSION,
        "job": job,
        "digest": "d" * 64,
        "ranks": (0, 1),
        "bindings": {},
        "inline": (0,),
        "timeout_s": 5.0,
    }
    base.update(fields)
    return bytes(encode(Exec(**base))[1])


def _frame(job: str, boxes: tuple[bytes, ...] = (BOX, BOX[::-1]), **fields: Any) -> bytes:
    return _header(job, **fields) + b"".join(pack(box) for box in boxes)


def _same(readers: SealedExecReaders, data: bytes, peer: bytes = b"p", ranks: int = 2) -> str:
    """What ``readers`` and the full read make of ``data`` (the frame after the magic),
    checked equal: "read" or "refused"."""
    frames = [SEALED_EXEC_MAGIC, data]
    try:
        want = read_sealed_exec(frames, ranks)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            readers.read(peer, frames, ranks)
        return "refused"
    got = readers.read(peer, frames, ranks)
    assert got == want  # the Exec (every field), the header's bytes, each box's bytes
    assert type(got[1]) is bytes and all(type(box) is bytes for box in got[2])
    return "read"


def _repeats(readers: SealedExecReaders, peer: bytes = b"p") -> int:
    return readers._readers[peer].repeats


def test_a_repeat_is_read_by_comparison_as_the_full_read_reads_it() -> None:
    readers = SealedExecReaders()
    assert _same(readers, _frame("a" * 24)) == "read"
    assert _repeats(readers) == 0  # the first: read in full, kept
    for n in range(5):
        assert _same(readers, _frame(f"{n:024x}", (BOX[n:], BOX[: n + 1]))) == "read"
    assert _repeats(readers) == 5  # every later one by comparison
    # boxes of a bin16, a job id of another length, another program: the full read's
    long = bytes(300)
    assert _same(readers, _frame("b" * 24, (long, BOX))) == "read"
    assert _same(readers, _frame("b" * 7)) == "read"
    assert _same(readers, _frame("c" * 24, digest="e" * 64)) == "read"
    assert _same(readers, _frame("d" * 24, digest="e" * 64)) == "read"  # kept: a repeat
    # one sender's header is no other sender's to compare with
    assert _same(readers, _frame("e" * 24), peer=b"q") == "read"
    assert _repeats(readers, b"q") == 0


def test_every_byte_flipped_cut_or_added_reads_as_the_full_read_reads_it() -> None:
    """A repeat's frame with any byte changed (to each of three values), cut at any length
    or lengthened: the comparison answers as the full read does, whether it reads or
    refuses it, and a refused frame changes nothing kept."""
    readers = SealedExecReaders()
    _same(readers, _frame("a" * 24))
    genuine = _frame("f" * 24)
    outcomes: dict[str, int] = {}
    for at in range(len(genuine)):
        for value in {genuine[at] ^ 1, genuine[at] ^ 0x80, 0xC4}:
            changed = genuine[:at] + bytes([value]) + genuine[at + 1 :]
            outcome = _same(readers, changed)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            _same(readers, _frame("a" * 24))  # what is kept: the genuine header again
    for end in range(len(genuine)):
        _same(readers, genuine[:end])
    for more in (b"\x00", pack(BOX), b"\xc4\x00", b"\xc4\x05ab"):
        _same(readers, genuine + more)
    assert outcomes["read"] > 0 and outcomes["refused"] > 0
    assert _repeats(readers) > len(genuine)  # the comparison ran on most of them


def test_a_repeat_for_more_ranks_or_boxes_than_its_header_says_is_refused() -> None:
    readers = SealedExecReaders()
    _same(readers, _frame("a" * 24))
    for boxes in ((), (BOX,), (BOX, BOX, BOX)):
        assert _same(readers, _frame("g" * 24, boxes)) == "refused"
    # a header of three ranks to a broker of two: refused, whichever reads it
    readers = SealedExecReaders()
    _same(readers, _frame("a" * 24, (BOX,) * 3, ranks=(0, 1, 2)), ranks=3)
    assert _same(readers, _frame("h" * 24, (BOX,) * 3, ranks=(0, 1, 2)), ranks=2) == "refused"


def test_the_readers_keep_at_most_64_senders_and_no_long_header() -> None:
    readers = SealedExecReaders()
    for n in range(70):
        _same(readers, _frame("a" * 24), peer=b"%d" % n)
    assert len(readers._readers) == 64 and b"0" not in readers._readers
    readers = SealedExecReaders()
    _same(readers, _frame("a" * 24, digest="d" * 1100))  # a header of 1 KiB or more
    assert readers._readers == {}
