"""The codec: one record <-> a list of ZeroMQ frames.

A message has two forms. The codec's (``encode``'s output, ``decode``'s input, what the
lean readers and writers of ``mpl.wire`` pass around)::

    [0]   MAGIC_FRAME   b"MPL" + one version byte
    [1]   header        msgpack array [tag, field0, field1, ...] of one Record
    [2..] buffers       raw bytes referenced from the header by index (0 = [2])

and the wire's, since wire version 4 (after any routing envelope the socket adds)::

    frame 0   MAGIC_FRAME + header   the 4 magic bytes, then the header, in ONE frame
    frame 1.. buffers                buffer index 0 = frame 1

``to_wire`` and ``from_wire`` turn one into the other where a message meets a socket. One
frame for magic and header because CurveZMQ boxes every frame separately (a box, a nonce, a
MAC and a libzmq part each): a secure round trip of a small message cost 33k instructions
with two frames, 17.5k with one. ``from_wire`` never refuses: a first frame of another
version (a version-3 message's 4-byte magic frame included), too short or empty reads as a
magic ``decode`` and the lean readers refuse.

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
8 COMPLEX  two little-endian float64 (raw, not msgpack)       complex
9 SET      [frozen (bool), items]                             set / frozenset
10 TABLE   [kind 0 DataFrame, 1 Series, 2 pyarrow.Table,      the table, read from Arrow
           3 unnamed Series; buffer index]                    IPC (``mpl.wire.tables``)
=========  =================================================  ==========================

Arrays and larger buffers (SPU share chunks) never enter msgpack: the sender hands their
memory to ZeroMQ (zero-copy from ``ZERO_COPY_BYTES``) and the receiver's array views the
frame it got. Every other object (callables included) goes through cloudpickle protocol 5
with its large buffers out of band, except in *safe mode* (``mpl.wire.safe_values``): there
the sender refuses it with ``UnsafeValueError`` and the receiver refuses any pickle with
``ProtocolError``. ``decode`` raises :class:`ProtocolError` for anything malformed, and
nothing else. The decoding half lives in ``mpl.wire.decoder``.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from mpl.wire.decoder import (
    ARRAY,
    BIGINT,
    BUFFER,
    EMPTY_PART,
    PICKLE,
    RECORD,
    SCALAR,
    TUPLE,
    Decoder,
    Opaque,
    OpaqueRecord,
    Pickled,
    build_record,
    empty_part,
    frames_digest,
    set_wire_digest,
)
from mpl.wire.errors import MessageTooLargeError, ProtocolError, UnsafeValueError
from mpl.wire.limits import MAX_DEPTH, MAX_FRAMES, MAX_HEADER_BYTES, MAX_NESTING
from mpl.wire.record import Record, record_fields
from mpl.wire.safe_values import encode_extra, host_array, unsafe

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "MAGIC",
    "MAGIC_FRAME",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "SLICE_BELOW",
    "VERSION",
    "ZERO_COPY_BYTES",
    "Opaque",
    "Pickled",
    "check_safe",
    "decode",
    "encode",
    "foreign_version",
    "frames_digest",
    "frames_nbytes",
    "from_wire",
    "pickle_by_value",
    "split_head",
    "to_wire",
]

MAGIC = b"MPL"
# 2: a Done's and a JobResult's stats are one opaque blob per rank (mpl.wire.run_stats).
# 3: a secure Exec's sealed boxes follow one common header in its frame, one per rank
# (mpl.wire.sealed_exec, magic MPS), not in its bindings.
# 4: a message's magic and header travel in one frame (see to_wire): CurveZMQ's cost is
# per frame.
# Persisted files have a format version of their own (mpl.wire.persist).
VERSION = 4
MAGIC_FRAME = MAGIC + bytes([VERSION])
_BATCH = b"MPB"  # a batch's magic (mpl.wire.batch), the same version byte
_SEALED = b"MPS"  # a secure Exec's magic (mpl.wire.sealed_exec), the same version byte
ZERO_COPY_BYTES = 64 * 1024  # pyzmq's copy threshold: below it copying beats tracking

_BUF_KINDS: tuple[type, ...] = (bytes, bytearray, memoryview)
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1


def _cloudpickle() -> Any:
    """cloudpickle, imported when first needed: the broker never pickles or unpickles."""
    import cloudpickle

    return cloudpickle


class _Wrapped:
    """A value msgpack would pack natively that must take the extension path instead."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_INLINE_BYTES = 1024  # smaller bytes ride inside the header, larger ones get a frame
_ATOMS = frozenset({str, float, bool, type(None)})


def _prepare(obj: Any, level: int = 1) -> Any:
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
    if t is list or t is dict:
        if level > MAX_NESTING:  # the decoder refuses it (mpl.wire.limits): say so here
            raise ValueError(f"value nested deeper than {MAX_NESTING} levels")
        if t is list:
            return [_prepare(x, level + 1) for x in obj]
        return {_prepare(k, level + 1): _prepare(v, level + 1) for k, v in obj.items()}
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
    __slots__ = ("bufs", "safe")

    def __init__(self, safe: bool = False) -> None:
        self.bufs: list[Any] = []
        self.safe = safe  # refuse what would need a pickle (mpl.wire.safe_values)

    def pack(self, obj: Any) -> bytes:
        depth: int = getattr(_tls, "depth", 0)
        if depth >= MAX_DEPTH:  # the decoder would refuse it: fail here, at the sender
            raise ValueError(f"value nested deeper than {MAX_DEPTH} levels")
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
            return msgpack.ExtType(TUPLE, self.pack(list(obj)))
        np = sys.modules.get("numpy")  # without numpy loaded there is no array to send
        if np is not None and t is np.ndarray and not obj.dtype.hasobject:
            return msgpack.ExtType(ARRAY, self.pack(self._array(obj)))
        if isinstance(obj, Record):
            return msgpack.ExtType(RECORD, self.pack([obj.TAG, *record_fields(obj)]))
        if t is _Wrapped:
            return self._wrapped(obj.value)
        if t is Opaque:
            return self._opaque(obj)
        if t is OpaqueRecord:
            return msgpack.ExtType(RECORD, self.pack([obj.tag, *obj.fields]))
        if np is not None and isinstance(obj, np.generic) and not obj.dtype.hasobject:
            if (obj.dtype.fields is not None or not obj.dtype.itemsize) and empty_part(obj.dtype):
                raise UnsafeValueError(
                    f"cannot send a numpy scalar of dtype {obj.dtype}: {EMPTY_PART}"
                )
            descr = np.lib.format.dtype_to_descr(obj.dtype)
            return msgpack.ExtType(SCALAR, self.pack([descr, obj.tobytes()]))
        extra = encode_extra(obj, self)
        if extra is not None:
            return extra
        if self.safe:
            array = host_array(obj)
            if array is None:
                raise unsafe(obj)
            return msgpack.ExtType(ARRAY, self.pack(self._array(array)))
        if t is Pickled:
            return msgpack.ExtType(PICKLE, self.pack(self._pickled(obj.payload, obj.buffers)))
        return self._pickle(obj)

    def _wrapped(self, value: Any) -> msgpack.ExtType:
        t = type(value)
        if t is int:
            size = (value.bit_length() + 8) // 8
            return msgpack.ExtType(BIGINT, value.to_bytes(size, "big", signed=True))
        data = value
        if t is memoryview:
            data = value.cast("B") if value.c_contiguous else memoryview(value.tobytes())
        return msgpack.ExtType(BUFFER, self.pack([_BUF_KINDS.index(t), self.add(data)]))

    def _opaque(self, obj: Opaque) -> msgpack.ExtType:
        if obj.code == SCALAR:
            return msgpack.ExtType(SCALAR, obj.head)
        index = self.add(obj.buffer)
        return msgpack.ExtType(obj.code, self.pack([*obj.head, index]))

    def _array(self, arr: np.ndarray[Any, Any]) -> list[Any]:
        import numpy as np

        dtype = arr.dtype
        if (dtype.fields is not None or not dtype.itemsize) and empty_part(dtype):
            # refused here as the receiver refuses it (it may hold any number of items)
            raise UnsafeValueError(f"cannot send a numpy array of dtype {dtype}: {EMPTY_PART}")
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        descr = np.lib.format.dtype_to_descr(dtype)
        flat = arr.reshape(-1).view(np.uint8)
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
        return msgpack.ExtType(PICKLE, self.pack(self._pickled(payload, oob)))


def foreign_version(magic: Any) -> int | None:
    """The wire version of a message's (or batch's) first frame when it is mpl's magic of
    another version than this one's; None for this version's, and for anything else."""
    try:
        data = memoryview(magic).tobytes()
    except TypeError:
        return None
    if len(data) == 4 and data[:3] in (MAGIC, _BATCH, _SEALED) and data[3] != VERSION:
        return data[3]
    return None


# A first frame this short is copied once and sliced (a copy of under 8 KiB costs less
# than the calls that view it: a secure Exec to 16 ranks is over 1 KiB); a longer one is
# viewed, its header not copied.
SLICE_BELOW = 8 * 1024


def split_head(first: Any) -> tuple[bytes, Any]:
    """A wire message's first frame as (its first 4 bytes, the rest): the magic and the
    header when it is well formed. A short frame is copied and sliced; a long one's rest is
    a memoryview of it (no copy of a large header). Anything short of 4 bytes comes back
    whole as the "magic", for the reader to refuse."""
    try:
        view = memoryview(first)
    except TypeError:
        return first, b""  # not a buffer: decode refuses it
    if view.nbytes < SLICE_BELOW:
        data = view.tobytes()
        return data[:4], data[4:]
    return view[:4].tobytes(), view[4:]


def from_wire(frames: Sequence[Any]) -> list[Any]:
    """A message as received (``[magic + header, *buffers]``, no envelope) in the codec's
    form ``[magic, header, *buffers]``; an empty list stays empty."""
    if not frames:
        return []
    magic, header = split_head(frames[0])
    return [magic, header, *frames[1:]]


def to_wire(frames: Sequence[Any]) -> list[Any]:
    """A message in the codec's form (``[magic, header, *buffers]``, a batch's too) as it
    is sent: magic and header joined into one frame."""
    magic, header = frames[0], frames[1]
    if type(header) is bytes and type(magic) is bytes:
        return [magic + header, *frames[2:]]
    return [b"".join((magic, header)), *frames[2:]]


def encode(msg: Record, *, safe: bool = False) -> list[Any]:
    """Encode one record into frames ``[MAGIC_FRAME, header, *buffers]``.

    Buffers are the original objects' memory (no copy); send them with ``copy=False`` and
    keep the arrays unchanged until ZeroMQ is done with them. With ``safe=True`` only the safe
    value format is written: any other value raises :class:`UnsafeValueError` naming its
    type, and nothing is pickled.
    """
    if not isinstance(msg, Record) or not msg.TAG:
        raise TypeError(f"encode needs a tagged Record, got {type(msg).__name__}")
    enc = _Encoder(safe)
    header = _pack(enc, [msg.TAG, *record_fields(msg)])
    if len(header) > MAX_HEADER_BYTES:  # every receiver would refuse it: say why, here
        raise MessageTooLargeError(
            f"a {msg.TAG!r} message header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}: "
            "send bulk data as numpy arrays or bytes (they travel outside the header), or "
            "as files the parties read themselves (mpl.io)",
            size=len(header),
            limit=MAX_HEADER_BYTES,
        )
    return [MAGIC_FRAME, header, *enc.bufs]


def _pack(enc: _Encoder, obj: Any) -> bytes:
    outer = getattr(_tls, "encoder", None)  # encode() may run inside another's default()
    _tls.encoder = enc
    try:
        return enc.pack(obj)
    finally:
        _tls.encoder = outer


def check_safe(value: Any, where: str = "") -> None:
    """Raise :class:`UnsafeValueError` unless ``value`` is in the safe value format.

    ``where`` says where the value was going ("to the driver (fetch of j/0)"), for the
    message. Arrays cost nothing here (their memory is not touched).
    """
    try:
        _pack(_Encoder(safe=True), value)
    except UnsafeValueError as exc:
        raise unsafe(exc.type_name or "value", where) from None


def pickle_by_value(module: types.ModuleType) -> None:
    """Ship ``module``'s functions by value (their code), not by reference.

    By default cloudpickle sends functions of importable modules as "module.name", which a
    worker can only load if it has the same module installed. Functions of ``__main__`` always
    travel by value.
    """
    _cloudpickle().register_pickle_by_value(module)


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Total size of a frame list, for accounting."""
    return sum(memoryview(f).nbytes for f in frames)


def decode(frames: Sequence[Any], *, unpickle: bool = True, safe: bool = False) -> Record:
    """Decode frames made by :func:`encode` back into a record.

    ``frames`` may hold bytes, memoryviews or ``zmq.Frame`` objects (receive with
    ``copy=False`` to keep large arrays zero-copy). With ``unpickle=False`` pickled values
    come back as :class:`Pickled`, arrays and buffers as :class:`Opaque`, and both re-encode
    verbatim: the broker's mode (it routes data it never opens). With ``safe=True`` a
    pickled value anywhere in the message is a ProtocolError and is never loaded: use it for
    everything that comes from another party.

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
        other = foreign_version(magic)
        if other is not None:
            raise ProtocolError(
                f"wire version {other} is not supported: this mpl speaks wire version "
                f"{VERSION} (drivers, brokers and workers are upgraded together)"
            )
        raise ProtocolError(f"bad magic frame {magic[:16]!r}: not an mpl message")
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
    dec = Decoder(frames[2:], unpickle, safe, header_len)
    try:
        items = dec.unpack(header)
        msg = build_record(items)
        set_wire_digest(msg, header, dec.taken)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack, numpy and dataclass errors all mean "malformed"
        raise ProtocolError(f"malformed header: {type(exc).__name__}: {exc}") from exc
    if not all(dec.used):
        raise ProtocolError(f"{dec.used.count(False)} buffer frame(s) not referenced by the header")
    return msg
