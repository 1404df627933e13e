"""Frames -> values: the decoding half of the codec (``mpl.wire.codec.decode`` drives it).

Every decision here treats the frames as hostile: indexes are checked, each buffer frame is
used at most once, array shapes must match their buffers, extension nesting is bounded
(``MAX_DEPTH``), and in safe mode a pickle is refused without being looked at. Anything
malformed raises :class:`ProtocolError`; nothing else escapes (see ``codec.decode``).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from mpl.wire.errors import ProtocolError
from mpl.wire.limits import (
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_HEADER_ITEMS,
    MAX_NESTING,
    MAX_SAME_HASH,
    check_spread,
)
from mpl.wire.record import Record, record_class, record_from_fields
from mpl.wire.safe_values import COMPLEX, SET, TABLE, make_set, unpack_complex
from mpl.wire.tables import from_ipc

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ARRAY",
    "BIGINT",
    "BUFFER",
    "PICKLE",
    "RECORD",
    "SCALAR",
    "TUPLE",
    "Decoder",
    "Opaque",
    "OpaqueRecord",
    "Pickled",
    "build_record",
    "empty_part",
    "frames_digest",
    "set_wire_digest",
]

ARRAY, BUFFER, PICKLE, TUPLE, RECORD, SCALAR, BIGINT = range(1, 8)
# Records defined in modules that import numpy (so not at start-up): loaded from this fixed
# table when one first arrives, by a process that decodes values (never by the broker).
_LATE_RECORDS = {"spushare": "mpl.wire.shares"}
_MAX_DIMS = 64  # numpy's own limit
_TOO_MANY = f"header builds more than {MAX_CONTAINERS} lists, dicts and extension values"
_MAX_ITEMS = 1 << 48  # beyond any real array; keeps shape arithmetic in range


def _cloudpickle() -> Any:
    """cloudpickle, imported when first needed: the broker never pickles or unpickles."""
    import cloudpickle

    return cloudpickle


class Opaque:
    """An array, buffer, table or numpy scalar kept undecoded (``decode(..., unpickle=False)``):
    the broker routes data without materialising it, and without importing numpy."""

    __slots__ = ("buffer", "code", "head")

    def __init__(self, code: int, head: Any, buffer: Any) -> None:
        self.code = code
        self.head = head  # the ext payload without its buffer index (raw bytes for scalars)
        self.buffer = buffer

    def __repr__(self) -> str:
        return f"Opaque({self.code}, {self.head!r})"


class OpaqueRecord:
    """A nested record whose tag this process does not know, kept as ``tag`` and raw fields
    (``decode(..., unpickle=False)`` only). The broker routes records of modules it never
    imports (SPU shares, sealed payloads) without understanding them; it re-encodes them as
    they came, with their buffers still opaque. A top-level message must still be known."""

    __slots__ = ("fields", "tag")

    def __init__(self, tag: str, fields: list[Any]) -> None:
        self.tag = tag
        self.fields = fields

    def __repr__(self) -> str:
        return f"OpaqueRecord({self.tag!r}, {len(self.fields)} fields)"


class Pickled:
    """A pickled value kept opaque: the broker forwards these without ever unpickling."""

    __slots__ = ("buffers", "payload")

    def __init__(self, payload: Any, buffers: list[Any]) -> None:
        self.payload = payload
        self.buffers = buffers

    def load(self) -> Any:
        return _cloudpickle().loads(self.payload, buffers=self.buffers)

    def __repr__(self) -> str:
        return f"Pickled({len(memoryview(self.payload))} bytes, {len(self.buffers)} buffers)"


class Decoder:
    """One message's decoding state: its buffer frames, which are used, and how deep we are.

    ``unpickle=False`` is the broker's mode (arrays, buffers, tables and pickles stay opaque);
    ``safe=True`` refuses pickles (a ProtocolError; the payload is never loaded).
    """

    __slots__ = (
        "bufs",
        "containers",
        "counting",
        "depth",
        "map_len",
        "safe",
        "taken",
        "unpickle",
        "used",
    )

    def __init__(
        self,
        bufs: Sequence[Any],
        unpickle: bool,
        safe: bool = False,
        header_len: int = -1,
        map_len: int = MAX_HEADER_ITEMS,
    ) -> None:
        self.bufs = bufs
        # Every list or dict takes at least one byte of the header, so a header shorter
        # than MAX_NESTING (< MAX_CONTAINERS) can neither nest nor build too many: it is
        # decoded without msgpack's hooks (a Python call per container). Longer ones are
        # counted: walking them for their nesting would cost more than the hooks.
        self.counting = not 0 <= header_len < MAX_NESTING
        # Keys one map may hold when not counting (msgpack's ValueError past it): a caller
        # that skips the count for a header longer than MAX_NESTING bytes (result_read's
        # short answers) keeps every map within MAX_SAME_HASH keys, which no map's hashes
        # can flood; a longer map sends it to a counting Decoder
        self.map_len = map_len
        self.used = [False] * len(bufs)
        self.taken: list[Any] = []  # buffers in the order the header references them
        self.unpickle = unpickle
        self.safe = safe
        self.depth = 0
        self.containers = 0  # lists and dicts built so far, across every payload

    def unpack(self, data: bytes) -> Any:
        if self.depth >= MAX_DEPTH:
            raise ProtocolError(f"value nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        if not self.counting:
            try:
                items = msgpack.unpackb(
                    data,
                    ext_hook=self.ext,
                    strict_map_key=False,
                    raw=False,
                    max_array_len=MAX_HEADER_ITEMS,
                    max_map_len=self.map_len,
                )
            finally:
                self.depth -= 1
            return items
        built = self.containers
        try:
            items = msgpack.unpackb(
                data,
                ext_hook=self.ext,
                strict_map_key=False,
                raw=False,
                list_hook=self._built,
                # a map is built here, from its pairs, once its keys' hashes are counted
                object_pairs_hook=self._map,
                max_array_len=MAX_HEADER_ITEMS,  # refused before msgpack allocates them
                max_map_len=MAX_HEADER_ITEMS,
            )
        finally:
            self.depth -= 1
        if self.containers - built >= MAX_NESTING:  # fewer containers cannot nest that deep
            check_nesting(items)
        return items

    def _built(self, container: Any) -> Any:
        """Called by msgpack for each list and dict, and by :meth:`ext` for each value it
        builds without a payload of its own (a BIGINT, a complex, an opaque numpy scalar):
        bounds what a header may cost. Uncounted, a 16 MiB header of 3-byte BIGINTs made
        5.6 million calls (1.7 s of the broker's loop per message: red team w33, R33-6)."""
        self.containers += 1
        if self.containers > MAX_CONTAINERS:
            raise ProtocolError(_TOO_MANY)
        return container

    def _map(self, pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        """Called by msgpack for each map, with its pairs: counted as ``_built`` counts it,
        and built only if its keys do not flood one hash (``check_spread``). A header too
        short to be counted holds too few keys to (MAX_NESTING bytes: under 10 BIGINTs)."""
        self.containers += 1
        if self.containers > MAX_CONTAINERS:
            raise ProtocolError(_TOO_MANY)
        if len(pairs) > MAX_SAME_HASH:
            check_spread([key for key, _ in pairs], "map")
        return dict(pairs)

    def take(self, index: Any) -> Any:
        if type(index) is not int or not 0 <= index < len(self.bufs):
            raise ProtocolError(f"header references buffer {index!r}, message has {len(self.bufs)}")
        if self.used[index]:
            raise ProtocolError(f"buffer {index} is referenced twice")
        self.used[index] = True
        buf = self.bufs[index]
        self.taken.append(buf)
        return buf

    def ext(self, code: int, data: bytes) -> Any:
        if code == TUPLE:
            n = len(data) - 1
            if (
                0 <= n < 16
                and data[0] == 0x90 | n
                and (n == 0 or max(data[1:]) < 0x80)
                and self.depth < MAX_DEPTH
            ):
                # A short tuple of small non-negative ints (ranks, output indexes: one on
                # every Exec): each byte after the array header is one of its ints, so it
                # is read without a nested unpack. Counted and bounded as one would be.
                if self.counting:
                    self._built(None)
                return tuple(data[1:])
            items = self.unpack(data)
            if type(items) is not list:
                raise ProtocolError("tuple extension does not hold a list")
            return tuple(items)
        if code == ARRAY:
            if not self.unpickle:
                descr, shape, index = triple(self.unpack(data))
                return Opaque(ARRAY, [descr, shape], self.take(index))
            return self._array(self.unpack(data))
        if code == RECORD:
            first = len(self.taken)
            items = self.unpack(data)
            tag = items[0] if type(items) is list and items else None
            # The broker's mode keeps records it never imports opaque even when this process
            # has imported them (an in-process broker beside its workers): their buffers
            # stay Opaque there, which the record's own field checks would refuse.
            late = tag in _LATE_RECORDS
            if type(tag) is str and (record_class(tag) is None or (late and not self.unpickle)):
                if not self.unpickle:
                    return OpaqueRecord(tag, items[1:])
                if tag in _LATE_RECORDS:
                    importlib.import_module(_LATE_RECORDS[tag])
            rec = build_record(items)
            set_wire_digest(rec, data, self.taken[first:])
            return rec
        if code == BUFFER:
            kind, index = pair(self.unpack(data))
            if not self.unpickle:
                return Opaque(BUFFER, [kind], self.take(index))
            buf = memoryview(self.take(index))
            if kind == 0:
                return buf.tobytes()
            if kind == 1:
                return bytearray(buf)
            if kind == 2:
                return buf
            raise ProtocolError(f"unknown buffer kind {kind!r}")
        if code == SCALAR:
            if not self.unpickle:
                if self.counting:  # (read below, its pair is counted as a list)
                    self._built(None)
                return Opaque(SCALAR, data, None)
            import numpy as np

            descr, raw = pair(self.unpack(data))
            dtype = to_dtype(descr)
            if type(raw) is not bytes or len(raw) != dtype.itemsize:
                raise ProtocolError("numpy scalar of the wrong size")
            return np.frombuffer(raw, dtype=dtype)[0]
        if code == BIGINT:
            if self.counting:  # a call each, 3 bytes each: bounded as containers are
                self._built(None)
            return int.from_bytes(data, "big", signed=True)
        if code == PICKLE:
            return self._pickle(self.unpack(data))
        if code == COMPLEX:
            if self.counting:
                self._built(None)
            return unpack_complex(data)
        if code == SET:
            return make_set(self.unpack(data))
        if code == TABLE:
            kind, index = pair(self.unpack(data))
            if not self.unpickle:
                return Opaque(TABLE, [kind], self.take(index))
            return from_ipc(kind, self.take(index))
        raise ProtocolError(f"unknown extension type {code}")

    def _array(self, spec: Any) -> np.ndarray[Any, Any]:
        import numpy as np

        descr, shape, index = triple(spec)
        dtype = to_dtype(descr)
        if (
            type(shape) is not list
            or len(shape) > _MAX_DIMS
            or not all(type(d) is int and 0 <= d <= _MAX_ITEMS for d in shape)
        ):
            raise ProtocolError(f"bad array shape {shape!r}")
        count = 1
        for d in shape:  # Python ints: no silent overflow, unlike np.prod
            count *= d
        if count > _MAX_ITEMS:
            raise ProtocolError(f"array shape {tuple(shape)} is too large")
        buf = self.take(index)
        if memoryview(buf).nbytes != count * dtype.itemsize:
            raise ProtocolError(
                f"array buffer holds {memoryview(buf).nbytes} bytes, shape {tuple(shape)} "
                f"of {dtype} needs {count * dtype.itemsize}"
            )
        arr = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)  # (itemsize > 0)
        arr.flags.writeable = False
        return arr

    def _pickle(self, spec: Any) -> Any:
        if self.safe:
            raise ProtocolError(
                "a pickled value arrived where only the safe value format is accepted "
                "(it was not loaded); the sender must send plain data, or every party must "
                "declare the cluster trusted"
            )
        if type(spec) is not list or len(spec) != 3 or type(spec[2]) is not list:
            raise ProtocolError("malformed pickle descriptor")
        inline, index, oob_indexes = spec
        payload = inline if inline is not None else self.take(index)
        if inline is not None and (type(inline) is not bytes or index != -1):
            raise ProtocolError("malformed pickle descriptor")
        oob = [memoryview(self.take(i)) for i in oob_indexes]
        if not self.unpickle:
            return Pickled(payload, oob)
        try:
            return _cloudpickle().loads(payload, buffers=oob)
        except BaseException as exc:  # a pickle may raise SystemExit: it must not stop us
            hint = "; the sender's code or packages may be missing here"
            if isinstance(exc, ModuleNotFoundError):
                hint = (
                    f"; functions of module {exc.name!r} travel by reference: install it on "
                    "the workers, or ship it by value with mp.pickle_by_value(module)"
                )
            raise ProtocolError(
                f"cannot unpickle a value ({type(exc).__name__}: {exc}){hint}"
            ) from exc


def check_nesting(items: Any) -> None:
    """Refuse lists and dicts nested deeper than ``MAX_NESTING`` within one msgpack payload
    (each extension, a tuple or a record, is a payload of its own, bounded by
    ``MAX_DEPTH``): the encoder refuses the same, so what decodes always re-encodes."""
    stack: list[tuple[Any, int]] = [(items, 1)] if type(items) in (list, dict) else []
    while stack:
        obj, level = stack.pop()
        if level > MAX_NESTING:
            raise ProtocolError(f"value nested deeper than {MAX_NESTING} levels")
        children = obj.values() if type(obj) is dict else obj
        stack += [(x, level + 1) for x in children if type(x) is list or type(x) is dict]


def triple(obj: Any) -> tuple[Any, Any, Any]:
    if type(obj) is not list or len(obj) != 3:
        raise ProtocolError("malformed extension payload")
    return obj[0], obj[1], obj[2]


def pair(obj: Any) -> tuple[Any, Any]:
    if type(obj) is not list or len(obj) != 2:
        raise ProtocolError("malformed extension payload")
    return obj[0], obj[1]


def to_dtype(descr: Any) -> np.dtype[Any]:
    import numpy as np

    try:
        if isinstance(descr, list):
            descr = [tuple(x) if isinstance(x, list) else x for x in descr]
        dtype = np.lib.format.descr_to_dtype(descr)
    except Exception as exc:
        raise ProtocolError(f"bad dtype {descr!r}") from exc
    if dtype.hasobject:
        raise ProtocolError("object arrays cannot travel as raw buffers")
    if empty_part(dtype):
        raise ProtocolError(f"bad dtype {descr!r}: {EMPTY_PART}")
    return dtype


EMPTY_PART = (
    "a part of its items takes no bytes (a dtype of size 0, as V0, S0 or U0, or a field or "
    "subarray of one), so an array of it may stand for any number of items"
)


def empty_part(dtype: Any) -> bool:
    """Whether ``dtype``, or a field or subarray base within it, is of size 0. An array of
    such items is refused (as ``EMPTY_PART`` says) by sender and receiver: 2**48 items of
    V0 took no bytes and copying them (``np.array(x)``) ran for days, as did one 8-byte item
    holding a 2**30-item subarray of structs with a field of no bytes (10 s per item)."""
    if dtype.itemsize == 0:
        return True
    if dtype.fields is None and dtype.subdtype is None:  # most dtypes: no parts
        return False
    if dtype.subdtype is not None:
        return empty_part(dtype.subdtype[0])
    return any(empty_part(field[0]) for field in dtype.fields.values())


def build_record(items: Any) -> Record:
    if type(items) is not list or not items or type(items[0]) is not str:
        raise ProtocolError("header is not a [tag, fields...] array")
    cls = record_class(items[0])
    if cls is None:
        raise ProtocolError(f"unknown message tag {items[0]!r}")
    return record_from_fields(cls, items[1:])


def frames_digest(frames: Sequence[Any]) -> str:
    """The digest of a record's encoding (its header and buffer frames, without the magic):
    sha256 over each frame's length and bytes, as 32 hex digits."""
    h = hashlib.sha256()
    for frame in frames:
        view = memoryview(frame)
        h.update(view.nbytes.to_bytes(8, "little"))
        h.update(view)
    return h.hexdigest()[:32]


def set_wire_digest(rec: Record, header: Any, bufs: Sequence[Any]) -> None:
    """A record class that sets ``WIRE_DIGEST = True`` (the graph) gets its ``digest``
    computed by ``decode`` from the bytes it arrived in, so a receiver compares it with the
    digest a sender claims without trusting the sender or re-pickling anything."""
    if type(rec).WIRE_DIGEST:
        rec.__dict__["digest"] = frames_digest([header, *bufs])  # fills a cached_property
        rec.__dict__["wire_nbytes"] = sum(memoryview(f).nbytes for f in (header, *bufs))
