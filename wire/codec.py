"""The codec: one record <-> a list of ZeroMQ frames.

Frame layout of every message (after any routing envelope the socket adds)::

    frame 0   MAGIC_FRAME   b"MPL" + one version byte
    frame 1   header        msgpack array [tag, field0, field1, ...] of one Record
    frame 2.. buffers       raw bytes referenced from the header by index (0 = frame 2)

Inside the header, values use msgpack natively (None, bool, int, float, str, list, dict, and
bytes under 1 KiB) plus these extension types:

=========  =================================================  ==========================
ext code   payload (msgpack)                                  decodes to
=========  =================================================  ==========================
1 ARRAY    [dtype descr, shape, buffer index]                 read-only ndarray viewing
                                                              the received frame
2 BUFFER   [kind, buffer index]  kind 0 bytes, 1 bytearray,   bytes / bytearray (copied),
           2 memoryview                                       memoryview (zero-copy)
3 PICKLE   [inline bytes | None, payload index | -1,          the unpickled object, or a
           [out-of-band buffer indexes]]                      ``Pickled`` when not trusted
4 TUPLE    [items]                                            tuple
5 RECORD   [tag, fields...]                                   a nested Record
6 SCALAR   [dtype descr, raw bytes]                           numpy scalar
7 BIGINT   signed big-endian bytes                            int beyond 64 bits
=========  =================================================  ==========================

Arrays and larger buffers (SPU share chunks) never enter msgpack: the sender hands their
memory to ZeroMQ (zero-copy from ``ZERO_COPY_BYTES``) and the receiver's array views the
frame it got. Every
other object (callables included) goes through cloudpickle protocol 5 with its large buffers
out of band. ``decode`` raises :class:`ProtocolError` for anything malformed, and nothing else.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack

if TYPE_CHECKING:
    import numpy as np

from mpl.wire.errors import ProtocolError
from mpl.wire.record import Record, record_class, record_fields, record_from_fields

__all__ = [
    "MAGIC",
    "MAGIC_FRAME",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "VERSION",
    "ZERO_COPY_BYTES",
    "Opaque",
    "Pickled",
    "decode",
    "encode",
    "frames_digest",
    "frames_nbytes",
    "pickle_by_value",
]

MAGIC = b"MPL"
VERSION = 1
MAGIC_FRAME = MAGIC + bytes([VERSION])
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_FRAMES = 1 << 16
ZERO_COPY_BYTES = 64 * 1024  # pyzmq's copy threshold: below it copying beats tracking

_ARRAY, _BUFFER, _PICKLE, _TUPLE, _RECORD, _SCALAR, _BIGINT = range(1, 8)
_BUF_KINDS: tuple[type, ...] = (bytes, bytearray, memoryview)
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1


def _cloudpickle() -> Any:
    """cloudpickle, imported when first needed: the broker never pickles or unpickles."""
    import cloudpickle

    return cloudpickle


class Opaque:
    """An array, buffer or numpy scalar kept undecoded (``decode(..., unpickle=False)``):
    the broker routes data without materialising it, and without importing numpy."""

    __slots__ = ("buffer", "code", "head")

    def __init__(self, code: int, head: Any, buffer: Any) -> None:
        self.code = code
        self.head = head  # the ext payload without its buffer index (raw bytes for scalars)
        self.buffer = buffer

    def __repr__(self) -> str:
        return f"Opaque({self.code}, {self.head!r})"


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


class _Wrapped:
    """A value msgpack would pack natively that must take the extension path instead."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_INLINE_BYTES = 1024  # smaller bytes ride inside the header, larger ones get a frame
_ATOMS = frozenset({str, float, bool, type(None)})


def _prepare(obj: Any) -> Any:
    """Wrap what msgpack would otherwise swallow: buffers (they belong in frames, and
    bytearray/memoryview must keep their type) and ints beyond 64 bits."""
    t = type(obj)
    if t in _ATOMS:
        return obj
    if t is int:
        return obj if _INT64_MIN <= obj <= _UINT64_MAX else _Wrapped(obj)
    if t is bytes:
        return obj if len(obj) < _INLINE_BYTES else _Wrapped(obj)
    if t is bytearray or t is memoryview:
        return _Wrapped(obj)
    if t is list:
        return [_prepare(x) for x in obj]
    if t is dict:
        return {_prepare(k): _prepare(v) for k, v in obj.items()}
    return obj  # tuples, records and the rest reach Encoder.default


_tls = threading.local()


def _default(obj: Any) -> Any:
    encoder: _Encoder = _tls.encoder
    return encoder.default(obj)


def _packer(depth: int) -> Any:
    """A reusable msgpack Packer per nesting depth (a new Packer costs microseconds)."""
    packers: list[Any] | None = getattr(_tls, "packers", None)
    if packers is None:
        packers = _tls.packers = []
    while len(packers) <= depth:
        packers.append(
            msgpack.Packer(default=_default, strict_types=True, use_bin_type=True, autoreset=True)
        )
    return packers[depth]


class _Encoder:
    __slots__ = ("bufs",)

    def __init__(self) -> None:
        self.bufs: list[Any] = []

    def pack(self, obj: Any) -> bytes:
        depth: int = getattr(_tls, "depth", 0)
        _tls.depth = depth + 1
        try:
            packed: bytes = _packer(depth).pack(_prepare(obj))
        except BaseException:
            _tls.packers[depth] = msgpack.Packer(  # never reuse one that failed mid-way
                default=_default, strict_types=True, use_bin_type=True, autoreset=True
            )
            raise
        finally:
            _tls.depth = depth
        return packed

    def add(self, buf: Any) -> int:
        self.bufs.append(buf)
        return len(self.bufs) - 1

    def default(self, obj: Any) -> Any:
        t = type(obj)
        if t is tuple:
            return msgpack.ExtType(_TUPLE, self.pack(list(obj)))
        np = sys.modules.get("numpy")  # without numpy loaded there is no array to send
        if np is not None and t is np.ndarray and not obj.dtype.hasobject:
            return msgpack.ExtType(_ARRAY, self.pack(self._array(obj)))
        if isinstance(obj, Record):
            return msgpack.ExtType(_RECORD, self.pack([obj.TAG, *record_fields(obj)]))
        if t is _Wrapped:
            return self._wrapped(obj.value)
        if t is Opaque:
            return self._opaque(obj)
        if np is not None and isinstance(obj, np.generic) and not obj.dtype.hasobject:
            descr = np.lib.format.dtype_to_descr(obj.dtype)
            return msgpack.ExtType(_SCALAR, self.pack([descr, obj.tobytes()]))
        if t is Pickled:
            return msgpack.ExtType(_PICKLE, self.pack(self._pickled(obj.payload, obj.buffers)))
        return self._pickle(obj)

    def _wrapped(self, value: Any) -> msgpack.ExtType:
        t = type(value)
        if t is int:
            size = (value.bit_length() + 8) // 8
            return msgpack.ExtType(_BIGINT, value.to_bytes(size, "big", signed=True))
        data = value
        if t is memoryview:
            data = value.cast("B") if value.c_contiguous else memoryview(value.tobytes())
        return msgpack.ExtType(_BUFFER, self.pack([_BUF_KINDS.index(t), self.add(data)]))

    def _opaque(self, obj: Opaque) -> msgpack.ExtType:
        if obj.code == _SCALAR:
            return msgpack.ExtType(_SCALAR, obj.head)
        index = self.add(obj.buffer)
        return msgpack.ExtType(obj.code, self.pack([*obj.head, index]))

    def _array(self, arr: np.ndarray[Any, Any]) -> list[Any]:
        import numpy as np

        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        descr = np.lib.format.dtype_to_descr(arr.dtype)
        flat = arr.reshape(-1).view(np.uint8) if arr.dtype.itemsize else b""
        return [descr, list(arr.shape), self.add(flat)]

    def _pickled(self, payload: Any, buffers: list[Any]) -> list[Any]:
        oob = [self.add(b) for b in buffers]
        if len(memoryview(payload)) < _INLINE_BYTES:  # small: inline, as msgpack bin
            return [bytes(payload), -1, oob]
        return [None, self.add(payload), oob]

    def _pickle(self, obj: Any) -> msgpack.ExtType:
        oob: list[Any] = []

        def keep(buf: Any) -> bool:
            oob.append(buf.raw())
            return False

        try:
            payload = _cloudpickle().dumps(obj, protocol=5, buffer_callback=keep)
        except Exception as exc:
            raise TypeError(f"cannot send {type(obj).__name__} object: {exc}") from exc
        return msgpack.ExtType(_PICKLE, self.pack(self._pickled(payload, oob)))


def encode(msg: Record) -> list[Any]:
    """Encode one record into frames ``[MAGIC_FRAME, header, *buffers]``.

    Buffers are the original objects' memory (no copy); send them with ``copy=False`` and
    keep the arrays unchanged until ZeroMQ is done with them.
    """
    if not isinstance(msg, Record) or not msg.TAG:
        raise TypeError(f"encode needs a tagged Record, got {type(msg).__name__}")
    enc = _Encoder()
    outer = getattr(_tls, "encoder", None)  # encode() may run inside another's default()
    _tls.encoder = enc
    try:
        header = enc.pack([msg.TAG, *record_fields(msg)])
    finally:
        _tls.encoder = outer
    return [MAGIC_FRAME, header, *enc.bufs]


def pickle_by_value(module: types.ModuleType) -> None:
    """Ship ``module``'s functions by value (their code), not by reference.

    By default cloudpickle sends functions of importable modules as "module.name", which a
    worker can only load if it has the same module installed. Functions of ``__main__`` always
    travel by value.
    """
    _cloudpickle().register_pickle_by_value(module)


def frames_digest(frames: Sequence[Any]) -> str:
    """The digest of a record's encoding (its header and buffer frames, without the magic):
    sha256 over each frame's length and bytes, as 32 hex digits."""
    h = hashlib.sha256()
    for frame in frames:
        view = memoryview(frame)
        h.update(view.nbytes.to_bytes(8, "little"))
        h.update(view)
    return h.hexdigest()[:32]


def _set_wire_digest(rec: Record, header: Any, bufs: Sequence[Any]) -> None:
    """A record class that sets ``WIRE_DIGEST = True`` (the graph) gets its ``digest``
    computed by ``decode`` from the bytes it arrived in, so a receiver compares it with the
    digest a sender claims without trusting the sender or re-pickling anything."""
    if getattr(type(rec), "WIRE_DIGEST", False):
        rec.__dict__["digest"] = frames_digest([header, *bufs])  # fills a cached_property


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Total size of a frame list, for accounting."""
    return sum(memoryview(f).nbytes for f in frames)


class _Decoder:
    __slots__ = ("bufs", "taken", "unpickle", "used")

    def __init__(self, bufs: Sequence[Any], unpickle: bool) -> None:
        self.bufs = bufs
        self.used = [False] * len(bufs)
        self.taken: list[Any] = []  # buffers in the order the header references them
        self.unpickle = unpickle

    def unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self.ext, strict_map_key=False, raw=False)

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
        if code == _TUPLE:
            items = self.unpack(data)
            if type(items) is not list:
                raise ProtocolError("tuple extension does not hold a list")
            return tuple(items)
        if code == _ARRAY:
            if not self.unpickle:
                descr, shape, index = _triple(self.unpack(data))
                return Opaque(_ARRAY, [descr, shape], self.take(index))
            return self._array(self.unpack(data))
        if code == _RECORD:
            first = len(self.taken)
            rec = _build(self.unpack(data))
            _set_wire_digest(rec, data, self.taken[first:])
            return rec
        if code == _BUFFER:
            kind, index = _pair(self.unpack(data))
            if not self.unpickle:
                return Opaque(_BUFFER, [kind], self.take(index))
            buf = memoryview(self.take(index))
            if kind == 0:
                return buf.tobytes()
            if kind == 1:
                return bytearray(buf)
            if kind == 2:
                return buf
            raise ProtocolError(f"unknown buffer kind {kind!r}")
        if code == _SCALAR:
            if not self.unpickle:
                return Opaque(_SCALAR, data, None)
            import numpy as np

            descr, raw = _pair(self.unpack(data))
            dtype = _dtype(descr)
            if type(raw) is not bytes or len(raw) != dtype.itemsize:
                raise ProtocolError("numpy scalar of the wrong size")
            return np.frombuffer(raw, dtype=dtype)[0]
        if code == _BIGINT:
            return int.from_bytes(data, "big", signed=True)
        if code == _PICKLE:
            return self._pickle(self.unpack(data))
        raise ProtocolError(f"unknown extension type {code}")

    def _array(self, spec: Any) -> np.ndarray[Any, Any]:
        import numpy as np

        descr, shape, index = _triple(spec)
        dtype = _dtype(descr)
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise ProtocolError(f"bad array shape {shape!r}")
        buf = self.take(index)
        count = int(np.prod(shape, dtype=np.int64))
        if memoryview(buf).nbytes != count * dtype.itemsize:
            raise ProtocolError(
                f"array buffer holds {memoryview(buf).nbytes} bytes, shape {tuple(shape)} "
                f"of {dtype} needs {count * dtype.itemsize}"
            )
        if dtype.itemsize == 0:
            arr = np.empty(shape, dtype=dtype)
        else:
            arr = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
        arr.flags.writeable = False
        return arr

    def _pickle(self, spec: Any) -> Any:
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
        except Exception as exc:
            hint = "; the sender's code or packages may be missing here"
            if isinstance(exc, ModuleNotFoundError):
                hint = (
                    f"; functions of module {exc.name!r} travel by reference: install it on "
                    "the workers, or ship it by value with mp.pickle_by_value(module)"
                )
            raise ProtocolError(
                f"cannot unpickle a value ({type(exc).__name__}: {exc}){hint}"
            ) from exc


def _triple(obj: Any) -> tuple[Any, Any, Any]:
    if type(obj) is not list or len(obj) != 3:
        raise ProtocolError("malformed extension payload")
    return obj[0], obj[1], obj[2]


def _pair(obj: Any) -> tuple[Any, Any]:
    if type(obj) is not list or len(obj) != 2:
        raise ProtocolError("malformed extension payload")
    return obj[0], obj[1]


def _dtype(descr: Any) -> np.dtype[Any]:
    import numpy as np

    try:
        if isinstance(descr, list):
            descr = [tuple(x) if isinstance(x, list) else x for x in descr]
        dtype = np.lib.format.descr_to_dtype(descr)
    except Exception as exc:
        raise ProtocolError(f"bad dtype {descr!r}") from exc
    if dtype.hasobject:
        raise ProtocolError("object arrays cannot travel as raw buffers")
    return dtype


def _build(items: Any) -> Record:
    if type(items) is not list or not items or type(items[0]) is not str:
        raise ProtocolError("header is not a [tag, fields...] array")
    cls = record_class(items[0])
    if cls is None:
        raise ProtocolError(f"unknown message tag {items[0]!r}")
    return record_from_fields(cls, items[1:])


def decode(frames: Sequence[Any], *, unpickle: bool = True) -> Record:
    """Decode frames made by :func:`encode` back into a record.

    ``frames`` may hold bytes, memoryviews or ``zmq.Frame`` objects (receive with
    ``copy=False`` to keep large arrays zero-copy). With ``unpickle=False`` pickled values
    come back as :class:`Pickled`, arrays and buffers as :class:`Opaque`, and both re-encode
    verbatim: the broker's mode (it routes data it never opens).

    Raises :class:`ProtocolError` for any malformed input, and no other exception.
    """
    n = len(frames)
    if n < 2:
        raise ProtocolError(f"a message needs at least 2 frames, got {n}")
    if n - 2 > MAX_FRAMES:
        raise ProtocolError(f"too many frames: {n} (limit {MAX_FRAMES + 2})")
    try:
        magic = memoryview(frames[0]).tobytes()
        header = frames[1]
        header_len = memoryview(header).nbytes
    except TypeError as exc:
        raise ProtocolError(f"frames must be buffers: {exc}") from exc
    if magic != MAGIC_FRAME:
        if magic[:3] == MAGIC and len(magic) == 4:
            raise ProtocolError(f"wire version {magic[3]} is not supported (this is {VERSION})")
        raise ProtocolError(f"bad magic frame {magic[:16]!r}: not an mpl message")
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
    dec = _Decoder(frames[2:], unpickle)
    try:
        items = dec.unpack(header)
        msg = _build(items)
        _set_wire_digest(msg, header, dec.taken)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack, numpy and dataclass errors all mean "malformed"
        raise ProtocolError(f"malformed header: {type(exc).__name__}: {exc}") from exc
    if not all(dec.used):
        raise ProtocolError(f"{dec.used.count(False)} buffer frame(s) not referenced by the header")
    return msg
