"""Tables in the safe value format: pandas and pyarrow values as Arrow IPC streams.

A ``pandas.DataFrame``, a ``pandas.Series`` or a ``pyarrow.Table`` travels as one Arrow IPC
stream in one buffer frame; the receiver reads it back zero-copy and validates it in full
before handing it out. Compressed streams are refused before anything is read: a few bytes
of zstd can inflate to gigabytes, while an uncompressed stream's table only views its frame.

Arrow IPC is a data format: decoding it runs no code of the sender's choosing (pyarrow >=
14.0.1 no longer unpickles extension types). pandas' own metadata in the schema (index,
column order, dtypes) is JSON interpreted by pyarrow.

Nor may a table stand for more than its bytes: Arrow lets rows take none (a null column, a
run-end encoded one, list or string views of shared items, lists of size 0, binary of
width 0, structs of no fields, a dictionary inside a list or struct, whose items all name
one value), which ``to_pandas`` would build row by row, so those types are refused at any
depth and a table declares no more cells than its stream can hold (``_bulk``; the sender
refuses such a table first, as ``UnsafeValueError``).

pyarrow is an optional extra (``pip install mpl[tables]``). pandas and pyarrow are imported
only when a message holds a table, or when the value being sent is one of theirs (looked up
in ``sys.modules``, so sending other values never imports them).
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from mpl.wire.errors import ProtocolError, UnsafeValueError

__all__ = ["DATAFRAME", "SERIES", "TABLE", "UNNAMED_SERIES", "from_ipc", "table_kind", "to_ipc"]

DATAFRAME, SERIES, TABLE, UNNAMED_SERIES = 0, 1, 2, 3  # a Series named None keeps that name
_NEEDS_PYARROW = (
    "tables travel as Arrow IPC, which needs pyarrow: install it with `pip install mpl[tables]` "
    "on every party"
)


def table_kind(obj: Any) -> int | None:
    """DATAFRAME, SERIES or TABLE when ``obj`` is exactly one of those types, else None."""
    pd = sys.modules.get("pandas")
    if pd is not None:
        t = type(obj)
        if t is pd.DataFrame:
            return DATAFRAME
        if t is pd.Series:
            return UNNAMED_SERIES if obj.name is None else SERIES
    pa = sys.modules.get("pyarrow")
    if pa is not None and type(obj) is pa.Table:
        return TABLE
    return None


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        return None
    return pyarrow


def to_ipc(obj: Any, kind: int) -> Any:
    """``obj`` as an Arrow IPC stream (a ``pyarrow.Buffer``, which ZeroMQ sends as is)."""
    pa = _pyarrow()
    if pa is None:
        raise UnsafeValueError(f"cannot send a {type(obj).__name__}: {_NEEDS_PYARROW}")
    try:
        if kind == DATAFRAME:
            table = pa.Table.from_pandas(obj, preserve_index=True)
        elif kind in (SERIES, UNNAMED_SERIES):
            frame = obj.to_frame(name="series" if kind == UNNAMED_SERIES else obj.name)
            table = pa.Table.from_pandas(frame, preserve_index=True)
        else:
            table = obj
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        stream = sink.getvalue()
        why = _bulk(pa, table, stream.size)  # refused here, as the receiver would refuse it
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise UnsafeValueError(
            f"cannot send this {type(obj).__name__} as an Arrow table ({exc}); columns of "
            "Python objects do not travel between parties: convert them to numbers or strings"
        ) from exc
    if why:
        raise UnsafeValueError(
            f"cannot send this {type(obj).__name__} as an Arrow table: {why} (an all-None "
            "column: give it a dtype, say float with NaN)"
        )
    return stream


def from_ipc(kind: Any, buf: Any) -> Any:
    """Read a table sent by :func:`to_ipc`; ProtocolError for anything malformed."""
    if kind not in (DATAFRAME, SERIES, TABLE, UNNAMED_SERIES):
        raise ProtocolError(f"unknown table kind {kind!r}")
    pa = _pyarrow()
    if pa is None:
        raise ProtocolError(f"a table arrived, but {_NEEDS_PYARROW}")
    try:
        data = pa.py_buffer(buf)
        for message in pa.ipc.MessageReader.open_stream(data):
            if message.type in ("record batch", "dictionary") and _compressed(
                message.metadata.to_pybytes()
            ):
                raise ProtocolError("a compressed Arrow table was refused (it could inflate)")
        with pa.ipc.open_stream(data) as reader:
            table = reader.read_all()
        table.validate(full=True)  # hostile offsets must fail here, not crash a reader later
        why = _bulk(pa, table, data.size)
        if why:
            raise ProtocolError(why)
        if kind == TABLE:
            return table
        frame = table.to_pandas()
        if kind in (SERIES, UNNAMED_SERIES):
            if frame.shape[1] != 1:
                raise ProtocolError("a Series table must have exactly one column")
            series = frame.iloc[:, 0]
            return series.rename(None) if kind == UNNAMED_SERIES else series
        return frame
    except ProtocolError:
        raise
    except BaseException as exc:  # pyarrow and pandas raise many types; all mean malformed
        raise ProtocolError(f"malformed Arrow table: {type(exc).__name__}: {exc}") from exc


# Cells (rows times columns) a table may declare per byte of its stream: a bool cell is a
# bit, every other kind of cell kept below at least that; plus a few for small tables.
_CELLS_PER_BYTE, _CELLS_FREE = 8, 4096


def _bulk(pa: Any, table: Any, nbytes: int) -> str:
    """Why a table whose stream is ``nbytes`` long may stand for more than its bytes ("":
    it may not): a column of type null, run-end encoded, a list, string or binary view, a
    fixed-size list of size 0, fixed-size binary of width 0, a struct of no fields, a
    dictionary of nested values, or a dictionary below a column's top level, at any depth,
    or more cells than its bytes can hold. Such a table of a few hundred bytes declared
    millions of rows (20 million: 160 MB from 224 bytes by ``to_pandas``, and without end
    as a peer's move or a result; 200 string views of one 1 MiB string: 210 MB), where
    every other column's rows and items take at least a bit each."""
    cells = table.num_rows * table.num_columns
    if cells > _CELLS_PER_BYTE * nbytes + _CELLS_FREE:
        return f"an Arrow table of {nbytes} bytes declares {cells} cells: more than its bytes hold"
    for column in table.schema:
        why = _no_bytes(pa, column.type)
        if why:
            return (
                f"an Arrow table's column {column.name!r} is of a type whose {why}: refused, "
                "as it may stand for any amount of data (send it as plain values)"
            )
    return ""


def _no_bytes(pa: Any, kind: Any, nested: bool = False) -> str:
    """Why rows or items of the Arrow type ``kind`` (``nested``: items of another column's
    type, not a column's own rows) may take no bytes of a stream ("": none may)."""
    types = pa.types
    if types.is_null(kind):
        return "rows are all null, with no bytes"
    if types.is_run_end_encoded(kind):
        return "runs stand for any number of rows"
    if types.is_list_view(kind) or types.is_large_list_view(kind):
        return "rows may all view the same items"
    if types.is_string_view(kind) or types.is_binary_view(kind):
        return "rows may all view the same bytes"
    if types.is_fixed_size_list(kind) and kind.list_size == 0:
        return "rows are empty lists, with no bytes"
    if types.is_fixed_size_binary(kind) and kind.byte_width == 0:
        return "rows are empty bytes, with no bytes"
    if types.is_struct(kind) and kind.num_fields == 0:
        return "rows are empty structs, with no bytes"
    if isinstance(kind, pa.BaseExtensionType):
        return _no_bytes(pa, kind.storage_type, nested)
    if types.is_dictionary(kind):
        # a column's own dictionary becomes a pandas Categorical (its values built once);
        # items of a list or struct are built one by one, each a copy of the value it
        # names: one 1 MiB string named by 1,000 one-byte items became 1.1 GB
        if nested:
            return "items may all name one value, built again for each"
        if kind.value_type.num_fields:
            return "rows may all name one nested value"
        return _no_bytes(pa, kind.value_type, True)
    for index in range(kind.num_fields):
        why = _no_bytes(pa, kind.field(index).type, True)
        if why:
            return why
    return ""


def _compressed(meta: bytes) -> bool:
    """Whether an IPC message (its flatbuffer ``Message``) declares body compression.

    Read by hand, with every offset checked: ``Message.header`` (field 2) is a RecordBatch,
    or a DictionaryBatch whose ``data`` (field 1) is one; a RecordBatch's ``compression`` is
    its field 3.
    """

    def read(fmt: str, pos: int) -> int:
        if pos < 0 or pos + struct.calcsize(fmt) > len(meta):
            raise ProtocolError("malformed Arrow message metadata")
        value: int = struct.unpack_from(fmt, meta, pos)[0]
        return value

    def field(table: int, index: int) -> int:
        vtable = table - read("<i", table)
        if 4 + 2 * index >= read("<H", vtable):
            return 0
        return read("<H", vtable + 4 + 2 * index)

    def child(table: int, index: int) -> int:
        offset = field(table, index)
        if not offset:
            raise ProtocolError("malformed Arrow message metadata")
        return table + offset + read("<I", table + offset)

    root = read("<I", 0)
    kind_at = field(root, 1)
    kind = read("<B", root + kind_at) if kind_at else 0
    batch = child(root, 2)
    if kind == 2:  # DictionaryBatch
        batch = child(batch, 1)
    elif kind != 3:  # RecordBatch
        raise ProtocolError(f"unexpected Arrow message type {kind}")
    return field(batch, 3) != 0
