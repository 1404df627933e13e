"""The driver's lean JobResult decoder accepts exactly what ``decode`` accepts, and builds the
same record: valid results, every field with a wrong type, bad frames, pickles in safe mode,
and thousands of mutated results."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from mpl.wire import ProtocolError, decode, encode
from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.control import Heartbeat
from mpl.wire.jobs import JobResult
from mpl.wire.remote import ErrorInfo
from mpl.wire.result_read import RESULT_HEAD, answer_fields, read_answer, read_result
from mpl.wire.run_stats import pack_stats

STATS = {  # each rank's stats blob, as its worker packs it
    0: pack_stats(7e-5, 1.7e9, [[0, "0 (pcall f)", 3e-5, 4e-5]]),
    1: pack_stats(4e-5, 1.7e9, []),
}

RESULTS = [
    JobResult("a" * 24, {0: {0: 1, 1: 1}}, None, False, STATS, {0: "int"}),
    JobResult("j", {0: {1: np.arange(6.0).reshape(2, 3)}, 1: {0: "text", 1: None}}),
    JobResult("j", {0: {0: (1, [2.5, {"k": b"raw"}])}}, metas={0: "tuple"}),
    JobResult("j", {0: {0: (2, 3), 1: ()}, 1: {0: b"\x00box"}}, stats=STATS),
    JobResult("j", error=ErrorInfo("RemoteError", "it broke", 1, "op 3", "ValueError")),
    JobResult("j", missing_program=True),
    JobResult("j"),
]


def outcome(read: Any, frames: list[Any], safe: bool) -> Any:
    try:
        return ("ok", read(frames, safe=safe))
    except ProtocolError:
        return ("refused", None)


@pytest.mark.parametrize("result", RESULTS, ids=range(len(RESULTS)))
@pytest.mark.parametrize("safe", [True, False])
def test_valid_results_decode_as_decode_does(result: JobResult, safe: bool) -> None:
    frames = encode(result)
    fast = read_answer(frames, safe=safe)
    assert type(fast) is JobResult
    assert repr(fast) == repr(decode(frames, safe=safe)) == repr(result)  # arrays too
    with pytest.raises(Exception, match="cannot assign"):  # as immutable as a decoded one
        fast.job = "other"


def test_other_messages_go_to_decode() -> None:
    frames = encode(Heartbeat({"objects": 3}))
    assert read_answer(frames, safe=True) == decode(frames, safe=True)


def _header(fields: list[Any]) -> list[Any]:
    return [MAGIC_FRAME, msgpack.packb(["result", *fields], use_bin_type=True)]


HUGE = msgpack.ExtType(7, (1 << 70).to_bytes(10, "big", signed=True))  # an int past 64 bits
GOOD = ["j", {0: {0: 1}}, None, False, {0: pack_stats(1.0, 0.0, [])}, {0: "int"}]
BAD_FIELDS: dict[str, list[Any]] = {
    "job": [1, None, b"j"],
    "values": [[], {"0": {0: 1}}, {0: [1]}, {0: {"0": 1}}, {True: {0: 1}}, {0: {HUGE: 1}}],
    "error": ["boom", 1, {}],
    "missing_program": [0, 1, None, "no"],
    "stats": [[], {"0": b""}, {0: []}, {0: {"run_s": 1.0}}, {HUGE: b""}, {0: "blob"}],
    "metas": [[], {0: 1}, {"0": "int"}, {0: None}],
}


@pytest.mark.parametrize("name", list(BAD_FIELDS))
def test_every_field_of_the_wrong_type_is_refused_as_decode_refuses_it(name: str) -> None:
    assert read_answer(_header(GOOD), safe=True) == decode(_header(GOOD), safe=True)
    at = ["job", "values", "error", "missing_program", "stats", "metas"].index(name)
    for bad in BAD_FIELDS[name]:
        fields = list(GOOD)
        fields[at] = bad
        with pytest.raises(ProtocolError):
            decode(_header(fields))
        with pytest.raises(ProtocolError):
            read_answer(_header(fields), safe=True)


def test_bad_frames_are_refused() -> None:
    good = encode(RESULTS[1])  # with a buffer frame
    for frames in (
        [*good, b"unreferenced"],
        good[:2],  # its buffer frame is missing
        _header(GOOD[:-1]),  # a field short
        _header([*GOOD, 1]),  # a field too many
        [b"XYZ\x01", good[1]],
        [MAGIC_FRAME, good[1][:-3]],
    ):
        assert outcome(decode, frames, True)[0] == "refused"
        assert outcome(read_answer, frames, True)[0] == "refused"


def test_a_pickle_is_refused_in_safe_mode_without_being_loaded() -> None:
    frames = encode(JobResult("j", {0: {0: {1, 2}.__class__}}))  # a type: pickled
    with pytest.raises(ProtocolError, match="pickled value"):
        read_answer(frames, safe=True)
    assert read_answer(frames, safe=False) == decode(frames, safe=False)


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = [bytes(f) for f in frames]
    i = rng.randrange(1, len(frames))
    f = bytearray(frames[i])
    if rng.random() < 0.7:
        for _ in range(rng.randrange(1, 4)):
            if len(f) > 9:  # keep the tag mostly intact: the lean path is what we test
                f[rng.randrange(9, len(f))] = rng.randrange(256)
    else:
        del f[rng.randrange(9, len(f) + 1) :]
    frames[i] = bytes(f)
    return frames


@pytest.mark.timeout(60)
def test_mutated_results_are_accepted_or_refused_exactly_as_decode_does() -> None:
    rng = random.Random(12)
    samples = [[bytes(f) for f in encode(r)] for r in RESULTS]
    accepted = 0
    for _ in range(4000):
        frames = _mutate(rng, rng.choice(samples))
        for safe in (True, False):
            expected = outcome(decode, frames, safe)
            got = outcome(read_answer, frames, safe)
            assert got[0] == expected[0], frames
            if got[0] == "ok":
                accepted += 1
                assert repr(got[1]) == repr(expected[1])
            # frames as views: the path for frames that are not bytes reads them alike
            viewed = outcome(read_answer, [memoryview(f) for f in frames], safe)
            assert viewed[0] == expected[0], frames
    assert accepted > 100  # the mutations leave some results valid: both paths compared


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


def _raw_result(values: Any, stats: Any = None) -> list[bytes]:
    header = msgpack.packb(
        [JobResult.TAG, "j", values, None, False, stats or {}, {}], use_bin_type=True
    )
    return [MAGIC_FRAME, header]


def test_a_short_result_skips_the_container_hooks_and_deep_nesting_is_still_refused() -> None:
    from mpl.wire.limits import MAX_NESTING
    from mpl.wire.result_read import _counted_length

    typical = encode(RESULTS[0])[1]
    assert _counted_length(memoryview(typical)) == 0  # a handful of lists and maps
    # values nested past the limit (the header's own list and two maps count): refused as
    # decode refuses them, at every depth around the limit, in short and long headers
    for depth in range(MAX_NESTING - 4, MAX_NESTING + 2):
        for stats in (None, {0: b"x" * 9000}):
            frames = _raw_result({0: {0: _nested(depth)}}, stats)
            for safe in (True, False):
                assert outcome(read_answer, frames, safe)[0] == outcome(decode, frames, safe)[0]
    refused = _raw_result({0: {0: _nested(MAX_NESTING)}})
    assert _counted_length(memoryview(refused[1])) == len(refused[1])
    assert outcome(read_answer, refused, True)[0] == "refused"
    # many small containers side by side (no nesting): counted, and accepted as decode does
    wide = _raw_result({0: {i: [] for i in range(MAX_NESTING + 5)}})
    assert _counted_length(memoryview(wide[1])) == len(wide[1])
    assert outcome(read_answer, wide, True)[0] == outcome(decode, wide, True)[0] == "ok"


def test_a_short_result_without_buffers_is_read_without_a_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trivial job's result (scalars, a sealed box's bytes, short tuples of small ints)
    is read by msgpack alone; an extension only the Decoder reads, or a buffer frame, takes
    the Decoder, and both build what decode builds."""
    from mpl.wire import result_read
    from mpl.wire.decoder import Decoder

    made: list[int] = []

    class CountedDecoder(Decoder):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            made.append(1)
            super().__init__(*args)

    class CountedUncounted(result_read._Uncounted):  # the uncounted read's own Decoder
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            made.append(1)
            super().__init__(*args)

    monkeypatch.setattr(result_read, "Decoder", CountedDecoder)
    monkeypatch.setattr(result_read, "_Uncounted", CountedUncounted)
    for result, decoders in [
        (RESULTS[0], 0),  # scalars
        (RESULTS[3], 0),  # a short tuple, bytes, None
        (RESULTS[2], 1),  # a longer tuple: read by the Decoder
        (RESULTS[4], 1),  # an error: its ErrorInfo is a record
        (RESULTS[1], 1),  # an array: a buffer frame
    ]:
        made.clear()
        frames = encode(result)
        assert repr(read_answer(frames, safe=True)) == repr(decode(frames, safe=True))
        assert len(made) == decoders, result


def _by(job: str) -> Any:
    """read_result for ``job``'s answer, as a reader of (frames, safe=...): None (not read
    there: the caller reads it the general way) comes out as "not read"."""
    packed = msgpack.packb(job)

    def read(frames: list[Any], *, safe: bool) -> Any:
        got = read_result(frames, packed, safe=safe)
        if got is None:
            raise LookupError("not read")
        return got

    return read


def _as_zmq(frames: list[Any]) -> list[Any]:
    return [zmq.Frame(bytes(f)) for f in frames]


@pytest.mark.parametrize("result", RESULTS, ids=range(len(RESULTS)))
def test_a_jobs_own_result_is_read_as_read_answer_reads_it(result: JobResult) -> None:
    frames = encode(result)
    for given in (frames, _as_zmq(frames)):
        for safe in (True, False):
            mine = read_result(given, msgpack.packb(result.job), safe=safe)
            if len(frames) == 2:  # a magic and a header: read here
                assert type(mine) is JobResult
                assert repr(mine) == repr(read_answer(frames, safe=safe))
            else:  # buffer frames: for the general way
                assert mine is None
    assert read_result(frames, msgpack.packb("other"), safe=True) is None  # another job's
    assert read_result(encode(Heartbeat({})), msgpack.packb(result.job), safe=True) is None


@pytest.mark.parametrize("result", RESULTS, ids=range(len(RESULTS)))
def test_a_first_frame_read_alone_is_never_one_that_buffer_frames_follow(result: JobResult) -> None:
    """The driver's call site reads its answer's first frame without asking whether more
    follow (``alone``): a header that refers to buffer frames (or needs the Decoder for
    anything else) is left to the caller's full read, and what is read alone is what the
    full read makes of it."""
    frames = encode(result)
    first = bytes(frames[0]) + bytes(frames[1])
    head = RESULT_HEAD + msgpack.packb(result.job)
    for safe in (True, False):
        alone = answer_fields(first, head, safe=safe, alone=True)
        if len(frames) > 2 or result.error is not None:
            assert alone is None
        if result is RESULTS[0]:  # a trivial job's: read alone
            assert alone is not None
        if alone is not None:
            assert repr(alone) == repr(answer_fields(first, head, safe=safe))
        assert answer_fields(first, RESULT_HEAD + msgpack.packb("other"), safe=safe) is None


@pytest.mark.timeout(60)
def test_mutated_results_of_a_job_are_read_exactly_as_decode_reads_them() -> None:
    rng = random.Random(21)
    samples = [(r.job, [bytes(f) for f in encode(r)]) for r in RESULTS if len(encode(r)) == 2]
    read = 0
    for _ in range(4000):
        job, sample = rng.choice(samples)
        frames = _mutate(rng, sample)
        if rng.random() < 0.5:
            frames = _as_zmq(frames)
        for safe in (True, False):
            expected = outcome(decode, frames, safe)
            try:
                got = outcome(_by(job), frames, safe)
            except LookupError:  # not read: it must not be this job's result
                if expected[0] == "ok":
                    assert not (type(expected[1]) is JobResult and expected[1].job == job)
                continue
            read += 1
            assert got[0] == expected[0], frames
            if got[0] == "ok":
                assert repr(got[1]) == repr(expected[1])
    assert read > 1000


def _c_calls(fn: Any) -> list[str]:
    """Names of the C functions ``fn()`` calls (sys.setprofile's c_call events)."""
    import sys

    seen: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            seen.append(getattr(arg, "__name__", ""))

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_a_result_of_flat_values_is_read_without_a_pass_over_its_bytes() -> None:
    """A trivial job's answer (scalar values, every rank's stats blob): its fields show it
    nests three deep, so no byte is counted (bac702e counted its container markers with a
    bytes.translate over the whole header on every job: about 20 instructions a byte)."""
    result = JobResult("a" * 24, {0: {r: 1 for r in range(32)}}, None, False, {}, {0: "int"})
    result = JobResult(result.job, result.values, stats={r: STATS[0] for r in range(32)})
    frames = encode(result)
    packed = msgpack.packb(result.job)
    assert "translate" not in _c_calls(lambda: read_result(frames, packed, safe=True))
    read = read_result(frames, packed, safe=True)
    assert read is not None and repr(read) == repr(decode(frames, safe=True))


def test_a_jobs_own_result_nesting_deep_is_judged_as_decode_judges_it() -> None:
    from mpl.wire.limits import MAX_NESTING

    read = _by("j")
    for depth in range(MAX_NESTING - 4, MAX_NESTING + 2):
        for stats in (None, {0: b"\x91" * 200}):  # a blob full of list markers, or none
            frames = _raw_result({0: {0: _nested(depth)}}, stats)
            assert outcome(read, frames, True)[0] == outcome(decode, frames, True)[0]
    pack = msgpack.packb
    head = b"\x97" + pack(JobResult.TAG) + pack("j") + b"\x81\x00\x81\x00"
    # past msgpack's own stack (and packb's limit: written by hand): refused too
    deep = [MAGIC_FRAME, head + b"\x91" * 1999 + b"\x90" + pack(None) + pack(False) + b"\x80\x80"]
    assert outcome(read, deep, True)[0] == outcome(decode, deep, True)[0] == "refused"
