"""Codec round trips, zero-copy, and type fidelity."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import decoded_as
from hypothesis import given, settings
from hypothesis import strategies as st

from mpl.wire import Record, decode, encode
from mpl.wire.codec import MAGIC_FRAME, Pickled


@dataclass(eq=False, repr=False)
class Box(Record, tag="test.box"):
    value: Any


@dataclass(eq=False, repr=False)
class Typed(Record, tag="test.typed"):
    n: int
    name: str
    ranks: tuple[int, ...]
    table: dict[int, list[str]]
    maybe: float | None = None


def roundtrip(value: Any) -> Any:
    out = decode(encode(Box(value)))
    assert isinstance(out, Box)
    return out.value


def same(a: Any, b: Any) -> bool:
    """Equality that also checks container types and numpy arrays."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # includes ints beyond 64 bits
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.integers(-5, 5) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_native_values_roundtrip_with_their_types(value: Any) -> None:
    assert same(roundtrip(value), value)


dtypes = st.sampled_from(
    [
        "<f8",
        "<f4",
        "<f2",
        "<i8",
        "<i4",
        "|i1",
        "<u2",
        "|u1",
        "|b1",
        "<c16",
        "<M8[ns]",
        "<m8[s]",
        "<U3",
        "|S2",
    ]
)


@settings(max_examples=150, deadline=None)
@given(dtypes, st.lists(st.integers(0, 4), max_size=3), st.booleans())
def test_arrays_roundtrip_any_dtype_and_shape(
    dtype: str, shape: list[int], transpose: bool
) -> None:
    size = int(np.prod(shape, dtype=np.int64))
    raw = np.frombuffer(
        np.random.default_rng(size).bytes(size * np.dtype(dtype).itemsize), dtype=dtype
    )
    arr = raw.reshape(shape)
    if transpose and arr.ndim > 1:
        arr = arr.T  # non-contiguous
    out = roundtrip(arr)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert out.tobytes() == np.ascontiguousarray(arr).tobytes()
    assert not out.flags.writeable


def test_zero_d_empty_and_structured_arrays() -> None:
    for arr in (
        np.float64(2.5).reshape(()),
        np.zeros((0, 3)),
        np.zeros((2,), dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
    ):
        out = roundtrip(arr)
        assert out.shape == arr.shape and out.dtype == arr.dtype
        assert out.tobytes() == arr.tobytes()


def test_numpy_scalars_bytes_and_buffers_keep_their_types() -> None:
    for v in (np.float32(1.5), np.int64(-3), np.bool_(True), b"xy", bytearray(b"ab")):
        out = roundtrip(v)
        assert type(out) is type(v) and out == v
    mv = roundtrip(memoryview(b"hello"))
    assert isinstance(mv, memoryview) and mv.tobytes() == b"hello"
    # numpy's stubs give ndarray the buffer protocol from Python 3.12 only
    strided = memoryview(np.arange(10, dtype=np.uint8))[::2]  # type: ignore[arg-type]
    assert roundtrip(strided).tobytes() == bytes(range(0, 10, 2))


def test_arbitrary_objects_and_callables_go_through_cloudpickle() -> None:
    k = 7
    fn = roundtrip(lambda x: x + k)
    assert fn(1) == 8
    assert roundtrip({1, 2, 3}) == {1, 2, 3}
    big = {"payload": np.arange(100_000)}  # pickled container with an out-of-band buffer
    frames = encode(Box(_Holder(big)))
    assert len(frames) >= 3
    assert np.array_equal(decoded_as(Box, frames).value.data["payload"], big["payload"])


class _Holder:
    def __init__(self, data: Any) -> None:
        self.data = data


def test_pickled_values_pass_through_unopened() -> None:
    frames = encode(Box([_Holder(3), np.arange(5)]))
    opaque = decoded_as(Box, frames, unpickle=False)
    assert isinstance(opaque.value[0], Pickled)
    again = decoded_as(Box, encode(opaque))
    assert again.value[0].data == 3 and again.value[1].tolist() == [0, 1, 2, 3, 4]


def test_typed_record_roundtrip() -> None:
    msg = Typed(3, "x", (1, 2), {0: ["a"], 5: []}, 2.0)
    assert decode(encode(msg)) == msg
    assert encode(msg)[0] == MAGIC_FRAME


def test_large_arrays_are_zero_copy_on_both_sides() -> None:
    arr = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    frames = encode(Box(arr))
    assert np.shares_memory(np.asarray(frames[2]), arr)  # sender hands over its own memory
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        for s in (a, b):
            s.linger = 0
        a.bind("inproc://zc")
        b.connect("inproc://zc")
        a.send_multipart(frames, copy=False)
        got = b.recv_multipart(copy=False)
        out = decoded_as(Box, got).value
        assert np.array_equal(out, arr)
        # a zmq.Frame is a buffer; its stubs do not say so
        frame_view = np.frombuffer(got[2], dtype=np.uint8)  # type: ignore[call-overload]
        assert np.shares_memory(out, frame_view)  # the decoded array views the frame itself
    finally:
        a.close()
        b.close()
        ctx.term()


def test_encode_rejects_non_records_and_unpicklable_values() -> None:
    with pytest.raises(TypeError):
        encode("not a record")  # type: ignore[arg-type]
    import threading

    with pytest.raises(TypeError, match="cannot send"):
        encode(Box(threading.Lock()))


@pytest.mark.parametrize("size", [10, 500, 20_000])
def test_opaque_passthrough_keeps_every_kind_intact(size: int) -> None:
    value: list[Any] = [
        set(range(size)),  # pickled: inline or in a frame depending on its size
        np.arange(size, dtype=np.int32),
        np.float32(2.5),
        b"x" * size,
        bytearray(b"y" * 3),
    ]
    opaque = decoded_as(Box, encode(Box(value)), unpickle=False)
    from mpl.wire.codec import Opaque

    assert isinstance(opaque.value[1], Opaque)  # arrays stay undecoded in the broker's mode
    back = decoded_as(Box, encode(opaque)).value
    assert back[0] == value[0]
    assert back[1].tolist() == value[1].tolist()
    assert back[2] == value[2] and type(back[2]) is np.float32
    assert back[3] == value[3] and back[4] == value[4]
