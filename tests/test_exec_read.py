"""The lean Exec reader (``mpl.wire.hot.read_exec``), as the worker uses it on what the broker
forwards, accepts exactly what ``decode`` accepts and builds the same
record: the shapes a worker gets (no bindings, a sealed box, store names), every other shape
(handed to ``decode``), bad frames, and thousands of mutated messages."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from mpl.wire import ProtocolError, decode, encode
from mpl.wire.codec import MAGIC, MAGIC_FRAME, VERSION
from mpl.wire.control import Heartbeat
from mpl.wire.decoder import TUPLE
from mpl.wire.exec_pack import exec_frames
from mpl.wire.hot import read_exec
from mpl.wire.hot_spans import execs_for_ranks
from mpl.wire.jobs import Exec, Lit
from mpl.wire.record import Record


def read_broker_message(frames: Any, *, safe: bool) -> Record:
    """What the worker does with a message from the broker: the lean read, else decode."""
    rec = read_exec(frames)
    return rec if rec is not None else decode(frames, safe=safe)


LEAN = [  # what the broker forwards to a rank on a job's hot path
    Exec("s" * 17, "j" * 24, "d" * 32, (0, 1), {}, (0,), 600.0),
    Exec("s", "j", "d", (0,), {0: b"\x01sealed box" * 9}, (), 0.0),  # secure mode
    Exec("s", "j", "d", (3, 1, 2), {1: ["k/0", None, "sym:x"]}, (0, 2, 5), 5),
    Exec("sé", "jöb", "∂" * 40, tuple(range(15)), {0: [], 7: ["x" * 300]}, tuple(range(15)), 1.5),
    Exec("", "", "", (), {}, (), 0.25),
]
OTHER = [  # valid shapes beyond the worker's usual ones: read as decode reads them, or by it
    Exec("s", "j", "d", (0,), {0: [Lit(3)]}, (0,), 1.0),  # a record: always decode's
    Exec("s", "j", "d", (200,), {}, (), 1.0),  # a rank past a fixint
    Exec("s", "j", "d", tuple(range(16)), {}, (), 1.0),
    Exec("s", "j", "d", (0,), {-1: []}, (), 1.0),
    Exec("s", "j", "d", (0,), {0: [b"raw"]}, (), 1.0),
    Exec("s", "j", "d", (0,), {}, (), 1 << 40),
    Exec("s", "j", "x" * 70_000, (0,), {}, (), 1.0),  # a str32
]


def outcome(read: Any, frames: list[Any], safe: bool) -> Any:
    try:
        return ("ok", read(frames, safe=safe))
    except ProtocolError:
        return ("refused", None)


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (a float is not an int here)."""
    return repr(a) == repr(b) and _types(a) == _types(b)


def _types(rec: Any) -> Any:
    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return ("dict", [(walk(k), walk(x)) for k, x in v.items()])
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, [walk(x) for x in v])
        return type(v).__name__

    return [walk(getattr(rec, n)) for n in ("session", "job", "digest", "ranks", "bindings",
                                            "inline", "timeout_s")]  # fmt: skip


@pytest.mark.parametrize("msg", LEAN, ids=range(len(LEAN)))
def test_plain_execs_are_read_on_the_lean_path_as_decode_reads_them(msg: Exec) -> None:
    for frames in (encode(msg), exec_frames(msg)):
        lean = read_exec(frames)
        assert lean is not None, "the plain shape must not fall back to decode"
        assert type(lean) is Exec and _same(lean, decode(frames, safe=True)) and lean == msg
        with pytest.raises(Exception, match="cannot assign"):  # as immutable as decode's
            lean.job = "other"


def test_what_the_broker_forwards_to_a_rank_is_read_on_the_lean_path() -> None:
    boxes = {0: b"\x01box for rank 0" * 3, 1: b"\x01box for rank 1" * 3}  # secure mode
    for msg in (Exec("s", "j", "d", (0, 1), boxes, (0,), 600.0), LEAN[0], LEAN[2]):
        each = execs_for_ranks(exec_frames(msg), msg.ranks)
        assert each is not None
        for rank, frames in zip(msg.ranks, each, strict=True):
            lean = read_exec(frames)
            assert lean is not None and _same(lean, decode(frames, safe=True))
            assert lean.bindings == {r: b for r, b in msg.bindings.items() if r == rank}


def test_every_ranks_exec_cut_in_one_walk_holds_its_own_bindings_alone() -> None:
    """execs_for_ranks (what the broker sends every rank, in secure mode) makes for each
    rank the driver's Exec with its own bindings, or none, read alike by the lean reader
    and decode, with its entry's bytes as they came."""
    boxes = {r: b"\x01box for rank %d" % r * 3 for r in (0, 1, 200)}  # a rank past a fixint
    for msg in (
        Exec("s", "j", "d", (0, 1, 200), boxes, (0,), 600.0),
        Exec("s", "j", "d", (0, 1, 2), {1: b"\x01box"}, (0,), 600.0),  # rank 0, 2: none
        *LEAN,
    ):
        for frames in (encode(msg), exec_frames(msg)):
            each = execs_for_ranks(frames, msg.ranks)
            assert each is not None
            for rank, own in zip(msg.ranks, each, strict=True):
                lean = read_exec(own)
                assert lean is not None and _same(lean, decode(own, safe=True))
                assert lean.bindings == {r: b for r, b in msg.bindings.items() if r == rank}
    frames = exec_frames(LEAN[1])
    assert execs_for_ranks([*frames, b"buffer"], (0,)) is None  # buffer frames: encoded anew
    assert execs_for_ranks([frames[0], frames[1] + b"\xc0"], (0,)) is None  # trailing bytes
    assert execs_for_ranks([frames[0], frames[1][:-3]], (0,)) is None  # cut short
    assert execs_for_ranks(encode(Heartbeat()), (0,)) is None  # no Exec
    again = execs_for_ranks(frames, (0,))  # the reader still works
    assert again is not None and decode(again[0], safe=True) == LEAN[1]


@pytest.mark.parametrize("msg", OTHER, ids=range(len(OTHER)))
def test_other_shapes_are_read_as_decode_reads_them(msg: Exec) -> None:
    frames = encode(msg)
    lean = read_exec(frames)
    assert lean is None or _same(lean, decode(frames, safe=True))
    assert read_exec(encode(OTHER[0])) is None  # records in bindings take decode
    assert _same(read_broker_message(frames, safe=True), decode(frames, safe=True))


def test_other_messages_and_bad_frames_go_to_decode() -> None:
    hb = encode(Heartbeat({"objects": 3}))
    assert read_broker_message(hb, safe=True) == decode(hb, safe=True)
    good = encode(LEAN[0])
    for frames in (
        [*good, b"unreferenced"],
        [good[0]],
        [b"XYZ\x01", good[1]],
        [MAGIC + bytes([VERSION + 1]), good[1]],  # another wire version
        [MAGIC_FRAME, good[1][:-3]],
        [MAGIC_FRAME, good[1] + b"\x00"],  # bytes after the record
        [MAGIC_FRAME, 7],  # not a buffer
    ):
        assert read_exec(frames) is None
        assert outcome(read_broker_message, frames, True)[0] == "refused"


def _exec_header(*fields: Any) -> list[Any]:
    return [MAGIC_FRAME, msgpack.packb(["exec", *fields], use_bin_type=True)]


def _tuple(payload: Any) -> msgpack.ExtType:
    return msgpack.ExtType(TUPLE, msgpack.packb(payload))


def test_fields_of_the_wrong_type_are_refused_as_decode_refuses_them() -> None:
    good = ["s", "j", "d", _tuple([0]), {}, _tuple([]), 1.0]
    assert read_exec(_exec_header(*good)) is not None
    bad: dict[int, list[Any]] = {
        0: [1, None, b"s"],
        1: [1.5, []],
        2: [{}, True],
        3: [[0], _tuple({"a": 1}), "0"],
        4: [[], {"0": []}, {True: []}, None],
        5: [(0,), 3],
        6: ["1.0", None, True],
    }
    for at, values in bad.items():
        for value in values:
            fields = list(good)
            fields[at] = value
            frames = _exec_header(*fields)
            assert read_exec(frames) is None
            assert outcome(read_broker_message, frames, True)[0] == "refused", (at, value)


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    f = bytearray(frame)
    roll = rng.random()
    if roll < 0.6:
        for _ in range(rng.randrange(1, 4)):
            f[rng.randrange(6, len(f))] = rng.choice((rng.randrange(256), rng.randrange(0x80)))
    elif roll < 0.8:
        del f[rng.randrange(6, len(f) + 1) :]
    else:
        at = rng.randrange(6, len(f) + 1)
        f[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3)))
    return bytes(f)


@pytest.mark.timeout(120)
def test_mutated_execs_are_accepted_or_refused_exactly_as_decode_does() -> None:
    rng = random.Random(13)
    headers = [bytes(encode(m)[1]) for m in LEAN]
    lean = 0
    for _ in range(6000):
        frames = [MAGIC_FRAME, _mutate(rng, rng.choice(headers))]
        expected = outcome(decode, frames, True)
        fast = read_exec(frames)
        if fast is not None:
            lean += 1
            assert expected[0] == "ok" and _same(fast, expected[1]), frames
        for safe in (True, False):
            got = outcome(read_broker_message, frames, safe)
            assert got[0] == outcome(decode, frames, safe)[0], frames
            if got[0] == "ok":
                assert _same(got[1], outcome(decode, frames, safe)[1])
    assert lean > 300  # the mutations leave many on the lean path: both compared
