"""The broker's lean readers (``mpl.wire.hot``) on secure-mode messages: a ``Done`` or an
``Exec`` whose values are sealed boxes (``bytes``) is long enough to be walked for nesting,
but holds nothing that could nest; the walk is left out for it, and only for it: a deep
value or stats beside the boxes is still refused, as ``decode`` refuses it (stats by their
type: a blob nests nothing)."""

from __future__ import annotations

import msgpack
import pytest

from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.hot import read_done, read_exec
from mpl.wire.jobs import Done, Exec
from mpl.wire.limits import MAX_NESTING
from mpl.wire.run_stats import pack_stats
from mpl.wire.sealed import BOX_MAGIC

BOX = BOX_MAGIC + b"\x08driver:a" + bytes(range(60))  # a compact box's length, as bytes
STATS = pack_stats(1.5e-5, 1.7e9, [[0, "0 (pcall f)", 1e-6, 1.4e-5]])


def _refused_by_decode(frames: list[bytes]) -> bool:
    try:
        decode(frames, unpickle=False)
    except ProtocolError:
        return True
    return False


def test_a_sealed_done_is_read_without_a_nesting_walk(nesting_walks: list[int]) -> None:
    frames = encode(Done("s", "j", 0, {0: BOX, 1: BOX}, STATS, {0: "int"}))
    assert len(frames[1]) >= MAX_NESTING  # long enough that the length alone does not say
    read = read_done(frames)
    assert read is not None and read.values == {0: BOX, 1: BOX}
    assert nesting_walks == []


def test_a_sealed_exec_is_read_without_a_nesting_walk(nesting_walks: list[int]) -> None:
    frames = encode(Exec("s", "j", "d", (0, 1), {0: BOX, 1: BOX}, (0,), 5.0))
    assert len(frames[1]) >= MAX_NESTING
    msg = read_exec(frames)
    assert msg is not None and msg.bindings == {0: BOX, 1: BOX}
    assert nesting_walks == []


@pytest.mark.parametrize("where", ["value", "stats"])
def test_deep_nesting_beside_sealed_boxes_is_still_refused(
    where: str, nesting_walks: list[int]
) -> None:
    pack = msgpack.packb
    deep = b"\x91" * (MAX_NESTING - 1) + b"\x90"
    head = b"".join((b"\x98", pack("done"), pack("s"), pack("j"), pack(0)))
    if where == "value":
        values, stats = b"\x82\x00" + pack(BOX) + b"\x01" + deep, pack(STATS)
    else:
        values, stats = b"\x81\x00" + pack(BOX), b"\x81" + pack("ops") + deep
    frames = [MAGIC_FRAME, head + values + stats + b"\x80\x90"]
    assert _refused_by_decode(frames)
    # deep stats are no blob: refused by their type, before any walk
    assert read_done(frames) is None and nesting_walks == ([1] if where == "value" else [])


def test_deep_bindings_beside_a_sealed_box_are_still_refused(nesting_walks: list[int]) -> None:
    deep = b"\x91" * (MAX_NESTING - 1) + b"\x90"
    mark = msgpack.packb("MARK-5d1e")  # packed once in the header: spliced for the deep list
    header = encode(Exec("s", "j", "d", (0, 1), {0: BOX, 1: "MARK-5d1e"}, (0,), 5.0))[1]
    assert header.count(mark) == 1
    frames = [MAGIC_FRAME, header.replace(mark, deep)]
    assert _refused_by_decode(frames)
    assert read_exec(frames) is None and nesting_walks == [1]
