"""A JobResult of a job over more than ``MAX_SAME_HASH`` ranks (w33-wide).

The driver's lean answer reader builds no map of more than ``MAX_SAME_HASH`` keys unchecked
(a map of keys of one hash costs the square of their number to build: red team w31), so a
job over 33 ranks or more, whose values and stats hold a key per rank, was read by the
counting Decoder every time. A long map whose keys are all ints cannot flood one hash (a
64-bit int shares its hash with 12 others at most): such an answer now stays on the lean
path, read exactly as ``decode`` reads it, and a long map with any other key still goes to
the Decoder, which counts its hashes.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from mpl.wire import result_read
from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import JobResult
from mpl.wire.limits import MAX_SAME_HASH
from mpl.wire.run_stats import pack_stats

_P = (1 << 61) - 1  # CPython's hash modulus for numbers


def _wide_result(world: int, value: Any) -> JobResult:
    stats = {r: pack_stats(0.001, 1.7e9, [["add", 1.7e9, 0.0001, 0]]) for r in range(world)}
    return JobResult(job="j1", values={0: dict.fromkeys(range(world), value)}, stats=stats)


def _header(rec: JobResult) -> bytes:
    frames = encode(rec, safe=True)
    assert len(frames) == 2  # no buffer frames: the short answer msgpack reads alone
    return bytes(frames[1])


def _no_decoder(*_: Any) -> Any:
    raise AssertionError("read by the Decoder: off the lean path")


@pytest.mark.parametrize("world", [MAX_SAME_HASH + 1, 48, 64])
@pytest.mark.parametrize("value", [3, b"\x01" * 40, None, 2.5])  # plain, sealed (secure)
def test_a_wide_jobs_answer_reads_lean_as_decode_reads_it(
    world: int, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    header = _header(_wide_result(world, value))
    assert len(header) < 8192
    want = decode([MAGIC_FRAME, header], safe=True)
    assert isinstance(want, JobResult) and len(want.values[0]) == world
    head = result_read.RESULT_HEAD + msgpack.packb("j1")
    monkeypatch.setattr(result_read, "_decoded", _no_decoder)
    monkeypatch.setattr(result_read, "decode", _no_decoder)
    # alone: None for anything msgpack alone does not read (it was None past 32 ranks)
    fields = result_read.answer_fields(MAGIC_FRAME + header, head, safe=True, alone=True)
    assert fields is not None
    assert fields[1:] == [want.job, want.values, None, False, want.stats, want.metas]
    # read_answer counts a header whose bytes hold MAX_NESTING list and map markers or more
    # (each stats blob holds some): the Decoder's, but the same result
    monkeypatch.undo()
    got = result_read.read_answer([MAGIC_FRAME, header], safe=True)
    assert isinstance(got, JobResult)
    assert got == want and got.values == want.values and got.stats == want.stats


@pytest.mark.parametrize("value", [[1, 2], {"k": 1.5}])
def test_a_wide_answer_of_nested_values_reads_as_decode_reads_it(value: Any) -> None:
    """Values that nest, beside many markers in the stats blobs: counted where the header
    holds too many list and map markers (as before), read alike."""
    header = _header(_wide_result(64, value))
    want = decode([MAGIC_FRAME, header], safe=True)
    assert isinstance(want, JobResult)
    head = result_read.RESULT_HEAD + msgpack.packb("j1")
    fields = result_read.answer_fields(MAGIC_FRAME + header, head, safe=True)
    assert fields is not None and fields[2] == want.values and fields[5] == want.stats
    assert result_read.read_answer([MAGIC_FRAME, header], safe=True) == want


def test_a_long_map_of_one_hash_keys_still_goes_to_the_decoder() -> None:
    """A map past MAX_SAME_HASH keys (a value's) of ints and one float, of 41 numbers of one
    hash (floats and 64-bit ints), or of floats and ints: each reader leaves it to the
    Decoder, which reads it as decode does (the flood refused)."""
    ranks: list[Any] = list(range(63))
    floods: list[list[Any]] = [
        [2.0 ** (61 * k) for k in range(-17, 17)] + [1 + k * _P for k in range(2, 9)],
        [float(k) for k in range(-17, 17)] + ranks,  # (1.0 is 1: one key, as decode says)
    ]
    for keys in [[*ranks, 0.5], *floods]:
        inner = msgpack.Packer().pack_map_header(len(keys)) + b"".join(
            msgpack.packb(k) + b"\x00" for k in keys
        )
        header = result_read.RESULT_HEAD + msgpack.packb("j1") + b"\x81\x00\x81\x00" + inner
        header += b"\xc0\xc2\x80\x80"
        try:
            want: Any = decode([MAGIC_FRAME, header], safe=True)
        except ProtocolError as exc:
            want = str(exc)
        head = result_read.RESULT_HEAD + msgpack.packb("j1")
        assert result_read.answer_fields(MAGIC_FRAME + header, head, safe=True, alone=True) is None
        for lean in (True, False):
            try:
                got: Any = (
                    result_read.read_answer([MAGIC_FRAME, header], safe=True)
                    if lean
                    else result_read.answer_fields(MAGIC_FRAME + header, head, safe=True)
                )
            except ProtocolError as exc:
                got = str(exc)
            if isinstance(want, str):
                assert got == want and "share one hash" in want
            else:
                values = got.values if isinstance(got, JobResult) else got[2]
                assert values == want.values


def test_int_keys_share_a_hash_too_rarely_to_flood() -> None:
    """What the lean path rests on: msgpack's ints (from -2**63 to 2**64 - 1) of one hash
    number 13 at most (hash 0: 0 and the multiples of the modulus, either sign)."""
    for h in (0, 1, -2, _P - 1):
        same = [n for k in range(-6, 10) if -(1 << 63) <= (n := h + k * _P) < (1 << 64)]
        assert sum(hash(n) == hash(h) for n in same) <= 13 < MAX_SAME_HASH


def test_a_malformed_wide_answer_is_refused_as_decode_refuses_it() -> None:
    header = _header(_wide_result(40, 3))[:-3]  # cut short inside metas / stats
    with pytest.raises(ProtocolError):
        decode([MAGIC_FRAME, header], safe=True)
    with pytest.raises(ProtocolError):
        result_read.read_answer([MAGIC_FRAME, header], safe=True)
    head = result_read.RESULT_HEAD + msgpack.packb("j1")
    with pytest.raises(ProtocolError):
        result_read.answer_fields(MAGIC_FRAME + header, head, safe=True)
