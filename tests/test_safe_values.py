"""The safe value format (``mpl.wire.safe_values``): exact round trips, refusal at the sender,
no pickle ever loaded in safe mode, and hostile input that only ever gives ProtocolError."""

from __future__ import annotations

import contextlib
import random
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from helpers import decoded_as
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mpl.wire import ProtocolError, decode, encode
from mpl.wire.codec import MAGIC_FRAME, check_safe
from mpl.wire.errors import UnsafeValueError
from mpl.wire.jobs import Lit
from mpl.wire.safe_values import MAX_DEPTH


def roundtrip(value: Any) -> Any:
    return decoded_as(Lit, encode(Lit(value), safe=True), safe=True).value


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, all the way down (arrays: dtype, shape and bytes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return bool(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, np.generic):
        return bool(a.dtype == b.dtype and a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    return bool(a == b)


ALL_DTYPES = [
    "?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "g",
    "c8", "c16", "G", "U5", "S5", "V4", "M8[ns]", "m8[s]", [("a", "<i4"), ("b", "<f8")],
]  # fmt: skip


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_arrays_of_every_non_object_dtype_round_trip_zero_copy(dtype: Any) -> None:
    raw = np.arange(24, dtype=np.uint8).tobytes() * 8
    dt = np.dtype(dtype)
    arr = np.frombuffer(raw[: 6 * dt.itemsize], dtype=dt).reshape(2, 3)
    frames = encode(Lit(arr), safe=True)
    back = decoded_as(Lit, frames, safe=True).value
    assert same(back, arr)
    assert same(roundtrip(arr[0, 1]), arr[0, 1])  # and its numpy scalar
    big = np.zeros(1 << 15, dtype="f8")  # 256 KiB: travels as its own memory, not a copy
    sent = encode(Lit(big), safe=True)
    assert np.shares_memory(np.frombuffer(sent[2], dtype=np.uint8), big)


def test_plain_values_and_containers_round_trip_exactly() -> None:
    value: dict[Any, Any] = {
        "none": None,
        "flags": [True, False],
        "ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**200, -(2**300)],
        "floats": [0.0, -1.5, float("inf")],
        "complex": [1 + 2j, complex(0, -0.0)],
        "text": "héllo",
        "bytes": b"x" * 5000,
        "nested": ({"a": [1, (2, 3)]}, [[[]]]),
        "set": {1, "a", (2, 3)},
        "frozen": frozenset({b"k"}),
        (1, "tuple key"): "v",
        2**70: "big key",
        frozenset({1}): "frozenset key",
    }
    assert same(roundtrip(value), value)


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


@pytest.mark.parametrize(
    "value",
    [Point(1), [1, {"k": Point(2)}], {Point(3)}, (Point(4),), {"a": [[Point(5)]]}],
    ids=["bare", "in-dict", "in-set", "in-tuple", "deep"],
)
def test_other_types_are_refused_at_the_sender_naming_the_type(value: Any) -> None:
    with pytest.raises(UnsafeValueError, match=r"test_safe_values\.Point") as info:
        encode(Lit(value), safe=True)
    assert "trusted: true" in str(info.value) and "arrays" in str(info.value)
    with pytest.raises(UnsafeValueError, match="to the driver"):
        check_safe(value, "to the driver (fetch of j/0)")
    assert isinstance(decoded_as(Lit, encode(Lit(value))).value, type(value))  # trusted: pickled


def test_subclasses_of_plain_types_are_refused_too() -> None:
    from collections import OrderedDict

    class Name(str):
        pass

    for value in (OrderedDict(a=1), Name("x"), np.array([object()], dtype=object)):
        with pytest.raises(UnsafeValueError):
            encode(Lit(value), safe=True)


class _Marker:
    """A pickle that writes a file when loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


class _Exit:
    def __reduce__(self) -> Any:
        return (sys.exit, (3,))


def test_safe_decode_refuses_a_pickle_without_loading_it(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    frames = encode(Lit({"x": [_Marker(marker)]}))  # a sender that ignores the rules
    with pytest.raises(ProtocolError, match="pickled value"):
        decode(frames, safe=True)
    assert not marker.exists()


def test_a_pickle_calling_sys_exit_is_a_protocol_error() -> None:
    frames = encode(Lit(_Exit()))
    with pytest.raises(ProtocolError, match="SystemExit"):
        decode(frames)  # the trusted path loads pickles: it must not stop the process


def test_nesting_is_bounded_both_ways() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH + 5):
        deep = (deep,)
    with pytest.raises(ValueError, match="nested deeper"):
        encode(Lit(deep), safe=True)
    inner = msgpack.packb([None])
    for _ in range(MAX_DEPTH + 5):  # hand-built: tuples in tuples beyond the bound
        inner = msgpack.packb([msgpack.ExtType(4, inner)])
    with pytest.raises(ProtocolError, match="nested deeper"):
        decode([MAGIC_FRAME, msgpack.packb(["lit", msgpack.ExtType(4, inner)])], safe=True)


def test_hostile_extension_payloads_are_protocol_errors() -> None:
    def lit(ext: Any, *bufs: bytes) -> list[Any]:
        return [MAGIC_FRAME, msgpack.packb(["lit", ext]), *bufs]

    cases = [
        lit(msgpack.ExtType(1, msgpack.packb(["<f8", [2**62, 2**62], 0])), b""),  # huge shape
        lit(msgpack.ExtType(1, msgpack.packb(["<f8", [1] * 65, 0])), b"\0" * 8),  # > 64 dims
        lit(msgpack.ExtType(1, msgpack.packb(["|O", [1], 0])), b"\0" * 8),  # object dtype
        lit(msgpack.ExtType(8, b"\0" * 15)),  # complex of the wrong size
        lit(msgpack.ExtType(9, msgpack.packb([False, [[1]]]))),  # unhashable set item
        lit(msgpack.ExtType(9, msgpack.packb(["no", []]))),
        lit(msgpack.ExtType(10, msgpack.packb([0, 0])), b"not arrow"),
        lit(msgpack.ExtType(10, msgpack.packb([7, 0])), b""),
        lit(msgpack.ExtType(99, b"")),
    ]
    for frames in cases:
        with pytest.raises(ProtocolError):
            decode(frames, safe=True)


# -- property tests ------------------------------------------------------------------------
_keys = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.complex_numbers(allow_nan=False),
)
_leaves = st.one_of(
    _keys,
    st.floats(allow_nan=False),
    st.binary(min_size=1000, max_size=3000),  # beyond the inline limit: a frame
    hnp.arrays(
        hnp.scalar_dtypes(),
        hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
        elements={"allow_nan": False},
    ),
)
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
        st.sets(_keys, max_size=4),
        st.frozensets(_keys, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_property_every_safe_value_round_trips_exactly(value: Any) -> None:
    back = roundtrip(value)
    if isinstance(value, (set, frozenset)):
        assert type(back) is type(value) and back == value
    else:
        assert same(back, value)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=4), st.binary(max_size=256))
def test_fuzz_random_frames_only_raise_protocol_error(bufs: list[bytes], header: bytes) -> None:
    for frames in ([MAGIC_FRAME, header, *bufs], [header, *bufs]):
        for unpickle in (True, False):
            with contextlib.suppress(ProtocolError):
                decode(frames, safe=True, unpickle=unpickle)


def _hostile_seeds() -> list[list[bytes]]:
    import pandas as pd

    values = [
        {"a": np.arange(6.0).reshape(2, 3), "s": {1, 2}, "c": 1j, "b": 2**90},
        pd.DataFrame({"x": [1, 2], "y": ["a", "b"]}),
        [frozenset({"k"}), (1, (2, (3,))), b"z" * 2000],
    ]
    return [[bytes(f) for f in encode(Lit(v), safe=True)] for v in values]


def test_fuzz_mutated_safe_messages_only_raise_protocol_error() -> None:
    pytest.importorskip("pandas", reason="mutating tables needs pandas (mpl[tables])")
    pytest.importorskip("pyarrow", reason="mutating Arrow tables needs pyarrow (mpl[tables])")
    rng = random.Random(9)
    seeds = _hostile_seeds()
    for _ in range(1500):
        frames = [bytearray(f) for f in rng.choice(seeds)]
        for _ in range(rng.randrange(1, 4)):
            f = frames[rng.randrange(1, len(frames))]
            if not f:
                continue
            i = rng.randrange(len(f))
            op = rng.randrange(3)
            if op == 0:
                f[i] = rng.randrange(256)
            elif op == 1:
                del f[i:]
            else:
                f[i:i] = rng.randbytes(rng.randrange(1, 9))
        with contextlib.suppress(ProtocolError):
            decode([bytes(f) for f in frames], safe=True)


# -- tables (Arrow IPC) ------------------------------------------------------------------
def test_dataframes_series_and_arrow_tables_round_trip_exactly() -> None:
    pd = pytest.importorskip("pandas", reason="tables need pandas and pyarrow (mpl[tables])")
    pa = pytest.importorskip("pyarrow", reason="tables need pyarrow (mpl[tables])")
    df = pd.DataFrame(
        {"i": [1, 2, 3], "f": [0.5, -1.0, 2.25], "s": ["a", "b", None], "t": [True, False, True]},
        index=pd.Index([10, 20, 30], name="id"),
    )
    pd.testing.assert_frame_equal(roundtrip(df), df)
    for series in (pd.Series([1.5, 2.5], name="v"), pd.Series(["x", "y"])):
        pd.testing.assert_series_equal(roundtrip(series), series)
    table = pa.table({"x": [1, 2], "y": ["p", "q"]})
    assert roundtrip(table).equals(table)
    nested = roundtrip({"frames": [df, df]})
    pd.testing.assert_frame_equal(nested["frames"][1], df)
    opaque = decode(encode(Lit(df), safe=True), unpickle=False)  # the broker: never opened
    pd.testing.assert_frame_equal(decoded_as(Lit, encode(opaque), safe=True).value, df)


def test_a_compressed_arrow_stream_is_refused_before_it_inflates() -> None:
    pa = pytest.importorskip("pyarrow", reason="tables need pyarrow (mpl[tables])")
    table = pa.table({"x": pa.array([0] * 100_000), "c": pa.array(["a", "b"] * 50_000)})
    table = table.set_column(1, "c", table.column("c").dictionary_encode())
    for compression in ("zstd", "lz4"):
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression=compression)
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        bomb = sink.getvalue()
        assert bomb.size < table.nbytes // 10
        frames = [MAGIC_FRAME, msgpack.packb(["lit", msgpack.ExtType(10, msgpack.packb([2, 0]))])]
        with pytest.raises(ProtocolError, match="compressed Arrow table"):
            decode([*frames, bomb], safe=True)


def test_a_dataframe_of_python_objects_is_refused_at_the_sender() -> None:
    pd = pytest.importorskip("pandas", reason="tables need pandas and pyarrow (mpl[tables])")
    pytest.importorskip("pyarrow", reason="tables need pyarrow (mpl[tables])")
    df = pd.DataFrame({"o": [Point(1), Point(2)]})
    with pytest.raises(UnsafeValueError, match="DataFrame"):
        encode(Lit(df), safe=True)
