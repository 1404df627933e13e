"""The driver's pre-packed Exec frames are byte for byte what the general encoder writes."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.data import Delete
from mpl.wire.exec_pack import delete_frames, exec_frames, exec_parts, pack_bindings
from mpl.wire.jobs import Exec, Lit

_atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),  # some beyond 64 bits
)
_binding = st.one_of(st.none(), st.text(max_size=30), _atoms.map(Lit))
_bindings = st.dictionaries(
    st.integers(min_value=0, max_value=40), st.lists(_binding, max_size=6), max_size=4
)


def _same(msg: Exec) -> list[Any]:
    fast, slow = exec_frames(msg), encode(msg)
    assert [bytes(f) for f in fast] == [bytes(f) for f in slow]
    return fast


@settings(max_examples=300, deadline=None)
@given(
    session=st.text(max_size=20),
    job=st.text(max_size=30),
    ranks=st.lists(st.integers(min_value=0, max_value=1000), max_size=5).map(tuple),
    bindings=_bindings,
    inline=st.lists(st.integers(min_value=0, max_value=100), max_size=4).map(tuple),
    timeout=st.floats(min_value=0, max_value=1e6),
)
def test_plain_execs_pack_to_the_encoders_bytes(
    session: str,
    job: str,
    ranks: tuple[int, ...],
    bindings: dict[int, list[Any]],
    inline: tuple[int, ...],
    timeout: float,
) -> None:
    msg = Exec(session, job, "d" * 64, ranks, bindings, inline, timeout)
    assert decode(_same(msg)) == msg
    assert decode(_same(msg)) == msg  # a second time, from the cached parts


def test_what_is_not_plain_takes_the_general_encoder() -> None:
    others: list[Any] = [
        Lit(np.arange(3.0)),  # an array travels as a frame of its own
        Lit(b"x" * 2000),  # large bytes too
        Lit([1, 2, (3, 4)]),
        Lit({"k": 1}),
        Lit(1 << 80),
        Lit(np.float32(1.5)),
    ]
    for lit in others:
        _same(Exec("s", "j", "d", (0, 1), {0: [lit], 1: ["j0/1", None]}, (0,), 5.0))
    _same(Exec("s", "j", "d", (0,), {0: [None]}, (), 0))  # an int timeout: general path
    for n in range(70):  # many sessions: the table of parts stays bounded, bytes still equal
        _same(Exec(f"s{n}", "j", "d", (0,), {0: [Lit(n)]}, (0,), 1.0))


@settings(max_examples=200, deadline=None)
@given(
    session=st.text(max_size=20),
    uris=st.dictionaries(
        st.integers(min_value=-(1 << 70), max_value=1 << 70),  # some beyond 64 bits
        st.lists(st.text(max_size=40), max_size=8),
        max_size=5,
    ),
)
def test_deletes_pack_to_the_encoders_bytes(session: str, uris: dict[int, list[str]]) -> None:
    fast, slow = delete_frames(session, uris), encode(Delete(session, uris))
    assert [bytes(f) for f in fast] == [bytes(f) for f in slow]
    if all(-(1 << 63) <= rank < (1 << 63) for rank in uris):  # what decode accepts
        assert decode(fast) == Delete(session, uris)


@settings(max_examples=100, deadline=None)
@given(
    ranks=st.lists(st.integers(min_value=0, max_value=1 << 20), min_size=1, max_size=40),
    row=st.lists(st.text(max_size=20), max_size=8),
    other=st.lists(st.text(max_size=20), max_size=3),
)
def test_a_delete_whose_ranks_share_one_list_packs_to_the_encoders_bytes(
    ranks: list[int], row: list[str], other: list[str]
) -> None:
    """Context.flush gives every rank of a group of values one list: packed once, the map
    written out (a fixmap, or a map 16 past 15 ranks), the bytes still encode's."""
    shared = dict.fromkeys(ranks, row)
    mixed = {**shared, -1: other, -2: row}  # not one list for all: packed as a whole
    for uris in (shared, mixed):
        fast, slow = delete_frames("s", uris), encode(Delete("s", uris))
        assert [bytes(f) for f in fast] == [bytes(f) for f in slow]
        assert decode(fast) == Delete("s", uris)
    with_bytes: Any = [*row, b"x"]  # bytes among the URIs: the encoder's way
    odd = dict.fromkeys(ranks, with_bytes)
    assert [bytes(f) for f in delete_frames("s", odd)] == [
        bytes(f) for f in encode(Delete("s", odd))
    ]


def test_a_delete_that_is_not_plain_takes_the_general_encoder() -> None:
    odd: Any = {0: ("a", "b")}  # a tuple, not a list: encode packs it as an extension
    assert [bytes(f) for f in delete_frames("s", odd)] == [
        bytes(f) for f in encode(Delete("s", odd))
    ]


@settings(max_examples=200, deadline=None)
@given(
    session=st.text(max_size=20),
    ranks=st.lists(st.integers(min_value=0, max_value=1000), max_size=5).map(tuple),
    bindings=_bindings,
    inline=st.lists(st.integers(min_value=0, max_value=100), max_size=4).map(tuple),
    timeout=st.floats(min_value=0, max_value=1e6),
)
def test_a_header_joined_from_exec_parts_is_the_encoders(
    session: str,
    ranks: tuple[int, ...],
    bindings: dict[int, list[Any]],
    inline: tuple[int, ...],
    timeout: float,
) -> None:
    """What a driver's call site joins per job (mpl.driver.job_site): the parts packed once,
    the job id as a fixstr of its 24 characters, the bindings packed per call."""
    job = "0123456789abcdef01234567"
    msg = Exec(session, job, "d" * 64, ranks, bindings, inline, timeout)
    parts = exec_parts(session, "d" * 64, ranks, inline, timeout)
    packed = pack_bindings(bindings)
    if parts is None or packed is None:  # not plain: the call site takes the general path
        return
    head, middle, tail = parts
    header = b"".join((head, b"\xb8" + job.encode(), middle, packed, tail))
    assert [MAGIC_FRAME, header] == [bytes(f) for f in encode(msg)]


def test_exec_parts_refuse_what_is_not_plain() -> None:
    assert exec_parts("s", "d", (0, 1), (0,), 600) is None  # an int time limit
    assert exec_parts("s", "d", (0, 1 << 70), (0,), 600.0) is None  # a rank past 64 bits
    assert exec_parts("s", "d", (0, True), (0,), 600.0) is None  # a bool is no rank
    assert exec_parts("s", "d", (0, 1), (0,), 600.0) is not None
