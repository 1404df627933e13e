"""Second red team w31, finding B1: two Arrow item types R2's check let through.

R2 refused types whose rows or items may take no bytes of a stream. Two more did, nested
in a list or struct (where the table's cell count bounds nothing):

* a dictionary column's items, one byte of index each, all naming one 1 MiB string:
  ``to_pandas`` builds the string again for every item (1,000 items: 1.1 GB from a 1 MB
  stream); a column's own dictionary stays a Categorical, its values built once;
* fixed-size binary of width 0 (as a fixed-size list of size 0, already refused): a
  344-byte stream of 4 rows of 2**20 items each, and a list size up to 2**31.

A table crosses parties as a peer's move (decoded on the worker's peer thread as it
arrives) or a result, so one hostile party (or the broker, to a driver) sent them.
"""

from __future__ import annotations

from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pandas")

from mpl.wire.codec import decode, encode  # noqa: E402
from mpl.wire.errors import ProtocolError, UnsafeValueError  # noqa: E402
from mpl.wire.jobs import Lit  # noqa: E402
from mpl.wire.tables import DATAFRAME, TABLE, from_ipc, to_ipc  # noqa: E402


def _stream(table: Any) -> Any:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _items_naming_one_string(items: int, size: int) -> Any:
    """One row: a list of ``items`` one-byte dictionary indexes, all naming one string."""
    names = pa.DictionaryArray.from_arrays(pa.array([0] * items, pa.int8()), pa.array(["x" * size]))
    return pa.table({"a": pa.ListArray.from_arrays(pa.array([0, items], pa.int32()), names)})


def _empty_binaries(rows: int, per_row: int) -> Any:
    items = pa.array([b""] * (rows * per_row), pa.binary(0))
    return pa.table({"a": pa.FixedSizeListArray.from_arrays(items, per_row)})


def test_list_items_naming_one_dictionary_value_are_refused() -> None:
    stream = _stream(_items_naming_one_string(200, 1 << 20))  # 210 MB once built
    assert stream.size < 1_100_000
    for kind in (DATAFRAME, TABLE):
        with pytest.raises(ProtocolError, match="name one value"):
            from_ipc(kind, stream)


def test_a_struct_field_of_a_dictionary_is_refused() -> None:
    names = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int8()), pa.array(["x"]))
    table = pa.table({"s": pa.StructArray.from_arrays([names], ["n"])})
    with pytest.raises(ProtocolError, match="name one value"):
        from_ipc(TABLE, _stream(table))


def test_binary_of_width_zero_is_refused() -> None:
    stream = _stream(_empty_binaries(4, 1 << 20))
    assert stream.size < 2048
    with pytest.raises(ProtocolError, match="empty bytes"):
        from_ipc(TABLE, stream)


def test_a_move_holding_one_is_refused_by_the_safe_decoder() -> None:
    frames = list(encode(Lit(pa.table({"a": pa.array([1.0])})), safe=True))
    frames[-1] = _stream(_items_naming_one_string(4, 1024))
    with pytest.raises(ProtocolError, match="name one value"):
        decode(frames, safe=True)


def test_the_sender_refuses_them_first() -> None:
    with pytest.raises(UnsafeValueError, match="name one value"):
        to_ipc(_items_naming_one_string(4, 16), TABLE)
    with pytest.raises(UnsafeValueError, match="empty bytes"):
        to_ipc(_empty_binaries(2, 4), TABLE)


def test_a_column_of_categories_still_travels() -> None:
    import pandas as pd

    frame = pd.DataFrame({"cat": pd.Categorical(["u", "v"] * 500), "x": range(1000)})
    pd.testing.assert_frame_equal(from_ipc(DATAFRAME, to_ipc(frame, DATAFRAME)), frame)
    column = pa.table({"d": pa.array(["a", "b", "a"]).dictionary_encode()})
    assert from_ipc(TABLE, to_ipc(column, TABLE)).equals(column)
