"""The worker's lean Done frames are byte for byte what the general encoder writes, and
whatever is not plain data takes the encoder's path."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mpl.wire.codec import decode, encode
from mpl.wire.done_pack import OneSpanDone, done_frames, own_done_frames
from mpl.wire.jobs import Done
from mpl.wire.limits import MAX_HEADER_BYTES
from mpl.wire.run_stats import pack_stats
from mpl.wire.sessions import SymbolInfo

_atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=1100),  # some past the codec's inline size (a frame of their own)
    st.integers(min_value=-(1 << 70), max_value=1 << 70),  # some beyond 64 bits
)
_values = st.recursive(
    _atoms,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),  # tuples are an extension type
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
    ),
    max_leaves=12,
)
_span = st.tuples(
    st.integers(min_value=0, max_value=500),
    st.text(max_size=20),
    st.floats(min_value=0, max_value=10),
    st.floats(min_value=0, max_value=10),
).map(list)


def _slow(msg: Done) -> list[bytes]:
    return [bytes(f) for f in encode(msg)]


@settings(max_examples=300, deadline=None)
@given(
    session=st.text(max_size=20),
    job=st.text(max_size=30),
    rank=st.integers(min_value=0, max_value=1000),
    values=st.dictionaries(st.integers(min_value=0, max_value=40), _values, max_size=4),
    spans=st.lists(_span, max_size=5),
    metas=st.dictionaries(st.integers(min_value=0, max_value=40), st.text(max_size=12)),
)
def test_dones_pack_to_the_encoders_bytes_or_leave_it_to_the_encoder(
    session: str,
    job: str,
    rank: int,
    values: dict[int, Any],
    spans: list[list[Any]],
    metas: dict[int, str],
) -> None:
    stats = pack_stats(0.25, 1.7e9, spans)
    msg = Done(session, job, rank, values, stats, metas)
    fast = done_frames(msg)
    if fast is None:
        return  # not plain: the caller encodes it (checked below for each kind)
    assert [bytes(f) for f in fast] == _slow(msg)
    assert [bytes(f) for f in fast] == [bytes(f) for f in encode(msg, safe=True)]
    assert decode(fast, safe=True) == msg


@settings(max_examples=200, deadline=None)
@given(
    values=st.dictionaries(st.integers(min_value=0, max_value=40), _values, max_size=4),
    spans=st.lists(_span, max_size=5),
    metas=st.dictionaries(st.integers(min_value=0, max_value=40), st.text(max_size=12)),
)
def test_a_done_the_worker_built_packs_as_done_frames_does(
    values: dict[int, Any], spans: list[list[Any]], metas: dict[int, str]
) -> None:
    stats = pack_stats(0.25, 1.7e9, spans)
    msg = Done("s", "j", 3, values, stats, metas)
    own, general = own_done_frames(msg), done_frames(msg)
    assert own == general  # same bytes; None (the encoder's path) for the same values
    if own is not None:
        assert decode(own, safe=True) == msg


def test_a_trivial_jobs_done_takes_the_lean_path() -> None:
    spans = [[0, "0 (pcall <lambda>)", 1.5e-6, 4.1e-6]]
    stats = pack_stats(3e-5, 1.7e9, spans)
    msg = Done("s" * 32, "j" * 24, 1, {0: 1}, stats, {0: "int"})
    fast = done_frames(msg)
    assert fast is not None
    assert [bytes(f) for f in fast] == _slow(msg)


def test_what_is_not_plain_takes_the_general_encoder() -> None:
    others: list[Any] = [
        np.arange(3.0),  # an array travels as a frame of its own
        np.float64(2.0),  # a numpy scalar is an extension type
        b"x" * 2000,  # large bytes too
        [1, 2, (3, 4)],  # a tuple inside
        1 << 70,  # a big int
        bytearray(b"ab"),
        [[[[["deep"]]]]],  # past the lean path's depth
    ]
    for value in others:
        assert done_frames(Done("s", "j", 0, {0: value})) is None, value
        assert own_done_frames(Done("s", "j", 0, {0: value})) is None, value
    saved = SymbolInfo("x", "P0", (0,), False, {})
    assert done_frames(Done("s", "j", 0, {0: 1}, saved=[saved])) is None
    assert done_frames(Done("s", "j", 0, {0: "\ud800"})) is None  # not UTF-8: encode says so
    assert done_frames(Done("s", "j", 0, {0: 1})) is not None  # the packer is fine after it
    huge = "x" * (MAX_HEADER_BYTES + 1)  # past the header cap: encode says why
    assert done_frames(Done("s", "j", 0, {0: huge})) is None


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.binary(max_size=300),  # a sealed scalar (secure mode): a box, some past a bin8
)


@settings(max_examples=300, deadline=None)
@given(
    session=st.text(max_size=40),
    job=st.text(max_size=40),
    rank=st.integers(min_value=0, max_value=100_000),
    op=st.integers(min_value=0, max_value=100_000),
    label=st.text(max_size=300),
    value=_scalars,
    held=st.booleans(),
    meta=st.sampled_from(["int", "float", "bool", "NoneType", "x" * 31, "y" * 32]),
    floats=st.lists(st.floats(allow_nan=False), min_size=4, max_size=4),
)
def test_a_one_span_done_is_the_encoders_bytes_or_none(
    session: str,
    job: str,
    rank: int,
    op: int,
    label: str,
    value: Any,
    held: bool,
    meta: str,
    floats: list[float],
) -> None:
    try:
        template = OneSpanDone(session, rank, op, label)
    except Exception:  # a session or label msgpack cannot pack: the fields' path
        return
    run_s, started, start, end = floats
    frame = template.frame(job, value, held, meta, run_s, started, start, end)
    if frame is None:
        return
    stats = pack_stats(run_s, started, [[op, label, start, end]])
    msg = Done(session, job, rank, {0: value} if held else {}, stats, {0: meta})
    assert [frame[:4], frame[4:]] == _slow(msg)
    assert decode([frame[:4], frame[4:]], safe=True) == msg


def test_a_trivial_jobs_one_span_done_is_packed_from_its_template() -> None:
    template = OneSpanDone("s" * 32, 1, 0, "0 (pcall <lambda>)")
    for value, meta in ((1, "int"), (0.5, "float"), (True, "bool"), (None, "NoneType")):
        frame = template.frame("j" * 24, value, True, meta, 3e-5, 1.7e9, 1.5e-6, 4.1e-6)
        assert frame is not None, value
        stats = pack_stats(3e-5, 1.7e9, [[0, "0 (pcall <lambda>)", 1.5e-6, 4.1e-6]])
        msg = Done("s" * 32, "j" * 24, 1, {0: value}, stats, {0: meta})
        assert [frame[:4], frame[4:]] == _slow(msg)
    assert template.frame("j" * 32, 1, True, "int", 0.0, 0.0, 0.0, 0.0) is None  # too long
    assert template.frame("\ud800", 1, True, "int", 0.0, 0.0, 0.0, 0.0) is None  # not UTF-8
    assert template.frame("j", 1 << 40, True, "int", 0.0, 0.0, 0.0, 0.0) is None  # an int


def test_a_sealed_jobs_one_span_done_is_packed_from_its_template() -> None:
    """Secure mode: the value is the scalar's compact box (bytes, about 60): joined as a
    msgpack bin8, the encoder's bytes, up to 255 bytes; a longer one takes the fields'
    path (2357d5f joined no bytes value: every sealed Done was packed from its fields)."""
    template = OneSpanDone("s" * 32, 1, 0, "0 (pcall <lambda>)")
    stats = pack_stats(3e-5, 1.7e9, [[0, "0 (pcall <lambda>)", 1.5e-6, 4.1e-6]])
    for size in (1, 60, 255):
        box = bytes(range(256))[:size]
        frame = template.frame("j" * 24, box, True, "int", 3e-5, 1.7e9, 1.5e-6, 4.1e-6)
        assert frame is not None, size
        msg = Done("s" * 32, "j" * 24, 1, {0: box}, stats, {0: "int"})
        assert [frame[:4], frame[4:]] == _slow(msg)
        assert decode([frame[:4], frame[4:]], safe=True) == msg
    assert template.frame("j", bytes(256), True, "int", 0.0, 0.0, 0.0, 0.0) is None
    assert template.frame("j", bytearray(8), True, "int", 0.0, 0.0, 0.0, 0.0) is None
