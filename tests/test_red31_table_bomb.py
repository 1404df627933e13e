"""Red team w31, finding R2: an Arrow table of a few hundred bytes decoded to any size.

A table travels between parties in the safe value format (a peer's move, decoded on the
worker's peer thread as it arrives, before its job is known; a result or fetched value,
decoded by the driver). Arrow lets rows take no bytes: a column of type null, a run-end
encoded one (one run for any number of rows), list views that all view the same items, a
list of size 0, a struct of no fields; and string views may all view one string.
``to_pandas`` then builds every row: a 224-byte stream of 20 million null rows became 160
MB, and 2**31 rows would be 16 GiB from one message of a hostile party (or broker, to a
driver). Now such types are refused at any depth, and a table may not declare more cells
than its bytes can hold.
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

_ROWS = 4_000_000  # 32 MB of pointers once built: enough to show it, cheap to refuse


def _stream(table: Any) -> Any:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _bombs() -> dict[str, Any]:
    nulls = pa.nulls(_ROWS)
    runs = pa.RunEndEncodedArray.from_arrays(pa.array([_ROWS], pa.int32()), pa.array([1.5]))
    one_list = pa.ListArray.from_arrays(pa.array([0, _ROWS], pa.int32()), nulls)
    return {
        "null column": pa.table({"a": nulls}),
        "run-end encoded": pa.table({"a": runs}),
        "list of nulls": pa.table({"a": one_list}),
        "struct of none": pa.table({"a": pa.array([{}] * 8, pa.struct([]))}),
    }


def _views_of_one_string(rows: int, size: int) -> Any:
    """``rows`` string views of one ``size``-byte string: the stream holds it once."""
    import struct

    view = struct.pack("<i4sii", size, b"xxxx", 0, 0)  # length, prefix, buffer 0, offset 0
    buffers = [None, pa.py_buffer(view * rows), pa.py_buffer(b"x" * size)]
    return pa.table({"a": pa.Array.from_buffers(pa.string_view(), rows, buffers)})


def test_string_views_of_one_string_are_refused_not_built() -> None:
    stream = _stream(_views_of_one_string(200, 1 << 20))  # 1 MiB: 210 MB once built
    for kind in (DATAFRAME, TABLE):
        with pytest.raises(ProtocolError, match="view the same bytes"):
            from_ipc(kind, stream)


@pytest.mark.parametrize("name", ["null column", "run-end encoded", "list of nulls"])
def test_a_table_of_rows_without_bytes_is_refused_not_built(name: str) -> None:
    stream = _stream(_bombs()[name])
    assert stream.size < 2048  # a few hundred bytes on the wire
    for kind in (DATAFRAME, TABLE):
        with pytest.raises(ProtocolError, match="Arrow table"):
            from_ipc(kind, stream)


def test_a_move_holding_such_a_table_is_refused_by_the_safe_decoder() -> None:
    # a hostile sender's frames: an ordinary table's, its stream swapped for the bomb
    frames = list(encode(Lit(pa.table({"a": pa.array([1.0])})), safe=True))
    frames[-1] = _stream(_bombs()["null column"])
    with pytest.raises(ProtocolError, match="Arrow table"):
        decode(frames, safe=True)


def test_a_struct_of_no_fields_is_refused() -> None:
    with pytest.raises(ProtocolError, match="empty structs"):
        from_ipc(TABLE, _stream(_bombs()["struct of none"]))


def test_ordinary_tables_still_travel() -> None:
    import pandas as pd

    frame = pd.DataFrame(
        {
            "x": range(100_000),
            "flag": [True, False] * 50_000,
            "name": ["a", "bb"] * 50_000,
            "cat": pd.Categorical(["u", "v"] * 50_000),
        }
    )
    back = from_ipc(DATAFRAME, to_ipc(frame, DATAFRAME))
    pd.testing.assert_frame_equal(back, frame)
    flags = pa.table({f"b{i}": pa.array([True] * 10_000) for i in range(8)})  # bits only
    assert from_ipc(TABLE, to_ipc(flags, TABLE)).equals(flags)
    lists = pa.table({"l": pa.array([[1, 2, 3]] * 1000)})
    assert from_ipc(TABLE, to_ipc(lists, TABLE)).equals(lists)


def test_the_sender_refuses_such_a_table_first() -> None:
    import pandas as pd

    with pytest.raises(UnsafeValueError, match="all-None column"):
        to_ipc(pd.DataFrame({"a": [None] * 10, "b": range(10)}), DATAFRAME)
    with pytest.raises(UnsafeValueError, match="view the same bytes"):
        to_ipc(_views_of_one_string(4, 100), TABLE)
