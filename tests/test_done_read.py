"""The broker's lean Done reader (``mpl.wire.hot.read_done``) against the general decode.

It takes a Done off the hot path without building the record, so it must accept exactly
what ``decode`` accepts (bar saved names and extension types, which it leaves to
``decode``), read the same fields, and the answer packed from what it read
(``packed_result``) must decode as the answer encoded from what ``decode`` read: compared
here on thousands of mutated messages.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from helpers import mutated

from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.hot import DONE_PREFIX, packed_result, read_done
from mpl.wire.jobs import Done, JobResult
from mpl.wire.run_stats import MAX_STATS_BYTES, pack_stats
from mpl.wire.sessions import SymbolInfo

STATS = pack_stats(1.5e-5, 1.7e9, [[0, "0 (pcall f)", 1e-6, 1.4e-5]])
VALUES: list[Any] = [
    1,
    -(1 << 40),
    2.5,
    "text",
    b"\x00\x01",
    None,
    True,
    [1, [2, [3]]],
    {"a": {"b": [1.0]}},
    (1, 2, 3),
    (1, "two", (3.0,)),
    1 << 80,
    complex(1, 2),
    {1, 2},
]


def _bases() -> list[Done]:
    out = [Done("s1", "job-1", 0), Done("s1", "job-1", 2, {0: 1}, STATS, {0: "int64[]"})]
    for i, v in enumerate(VALUES):
        out.append(Done("sess", f"j{i}", i % 3, {0: v, 3: VALUES[-1 - i]}, STATS, {3: "x"}))
    return out


def _decoded(frames: list[bytes]) -> Done | str | None:
    """decode's view: the Done, "saved" when it has saved names, None when refused."""
    try:
        msg = decode(frames, unpickle=False)
    except ProtocolError:
        return None
    if type(msg) is not Done:
        return None
    return "saved" if msg.saved else msg


def _has_ext(header: bytes) -> bool:
    seen: list[int] = []
    msgpack.unpackb(header, raw=False, strict_map_key=False, ext_hook=lambda c, d: seen.append(c))
    return bool(seen)


def _check(frames: list[bytes]) -> bool:
    """Compare read_done with decode on ``frames``; True when read_done took it."""
    read = read_done(frames)
    want = _decoded(frames)
    if not isinstance(want, Done):
        assert read is None, f"read_done took what decode refuses: {frames[1]!r}"
        return False
    if type(want.stats) is not bytes or len(want.stats) > MAX_STATS_BYTES:
        # decode takes any stats (a long blob comes as a frame); the broker's state checks
        # what it took, and the lean reader leaves anything but a short blob to it
        assert read is None, f"read_done took stats that are no blob: {frames[1]!r}"
        return False
    if read is None and _has_ext(frames[1]):
        return False  # extension types are decode's to check
    assert read is not None, f"read_done refused a plain Done decode takes: {frames[1]!r}"
    for name in ("session", "job", "rank", "stats", "metas", "saved"):
        assert getattr(read, name) == getattr(want, name), name
    assert repr(read.values) == repr(want.values)
    # what the broker answers with is packed from what it read: decoded, it is the same
    packed = packed_result("j", {i: {0: v} for i, v in read.values.items()}, {0: read.stats}, {})
    values = {i: {0: v} for i, v in want.values.items()}
    try:
        expected = decode(encode(JobResult("j", values, stats={0: want.stats})), unpickle=False)
    except (ProtocolError, ValueError):  # nested one level short of the limit: too deep here
        expected = None
    if packed is not None:
        try:
            result = decode(packed, unpickle=False)
        except ProtocolError:
            result = None
        assert repr(result) == repr(expected)
    return True


def test_every_plain_done_is_read_as_decode_reads_it() -> None:
    for done in _bases():
        frames = [bytes(f) for f in encode(done)]
        assert frames[1].startswith(DONE_PREFIX)
        assert _check(frames) != _has_ext(frames[1])


def test_mutated_dones_are_read_exactly_when_decode_accepts_them() -> None:
    rng = random.Random(1213)
    taken = refused = 0
    for done in _bases():
        header = bytes(encode(done)[1])
        for _ in range(150):
            if _check([MAGIC_FRAME, mutated(header, rng)]):
                taken += 1
            else:
                refused += 1
    assert taken > 100 and refused > 100  # both sides of the comparison were exercised


@pytest.mark.parametrize(
    "fields",
    [
        ["s", "j", "0", {}, {}, {}, []],  # rank not an int
        ["s", "j", True, {}, {}, {}, []],  # a bool is no rank
        ["s", "j", 1.0, {}, {}, {}, []],  # a float is no rank
        ["s", b"j", 0, {}, {}, {}, []],  # job as bytes
        ["s", "j", 0, {"0": 1}, {}, {}, []],  # output index as a string
        ["s", "j", 0, {}, {}, {0: 5}, []],  # a meta that is not a string
        ["s", "j", 0, {}, {}, {}, {}],  # saved not a list
        ["s", "j", 0, [], {}, {}, []],  # values not a map
        ["s", "j", 0, {}, {}, {}],  # a field missing
        ["s", "j", 0, {}, {}, {}, [], 1],  # a field too many
    ],
)
def test_a_done_with_a_malformed_field_is_left_to_decode_which_refuses_it(
    fields: list[Any],
) -> None:
    frames = [MAGIC_FRAME, msgpack.packb(["done", *fields], use_bin_type=True)]
    assert read_done(frames) is None
    assert _decoded(frames) is None


def test_saved_names_buffer_frames_and_other_magic_take_the_general_path() -> None:
    info = SymbolInfo("n", "P0", (0,), False, {})
    saved = encode(Done("s", "j", 0, {0: 1}, saved=[info]))
    assert len(saved) == 2 and read_done(saved) is None and _decoded(saved) == "saved"
    plain = [bytes(f) for f in encode(Done("s", "j", 0, {0: 1}))]
    assert read_done([plain[0], plain[1], b"extra"]) is None
    assert read_done([b"MPL0", plain[1]]) is None
    assert read_done(plain) is not None


@pytest.mark.parametrize("depth", [96, 97, 98, 99, 100])
def test_nesting_and_repeated_keys_are_judged_as_decode_judges_them(depth: int) -> None:
    """The header array and the values map are two levels: a value nested ``depth`` more
    is past MAX_NESTING (100) from 99 on, for read_done as for decode; a repeated output
    index keeps its last value in both."""
    deep = b"\x91" * (depth - 1) + b"\x90"
    pack = msgpack.packb
    head = b"".join((b"\x98", pack("done"), pack("s"), pack("j"), pack(0)))
    frames = [MAGIC_FRAME, head + b"\x81\x00" + deep + b"\xc4\x00\x80\x90"]
    assert (read_done(frames) is not None) == (depth < 99)
    _check(frames)
    twice = [MAGIC_FRAME, head + b"\x82\x00\x01\x00\x02\xc4\x00\x80\x90"]
    read = read_done(twice)
    assert read is not None and read.values == {0: 2}
    _check(twice)
