"""The safe value format: what may cross a party boundary, and nothing that runs code.

Values that leave one party for another (peer moves, SPU share transfers, results and fetch
replies to a driver, values persisted to disk) are encoded by the codec in *safe mode*
(``encode(msg, safe=True)`` / ``decode(frames, safe=True)``). It carries exactly:

=================================================  ======================================
value                                              travels as
=================================================  ======================================
``None``, ``bool``, ``int`` (any size), ``float``  msgpack (ints beyond 64 bits: BIGINT)
``complex``                                        COMPLEX: two little-endian doubles
``str``, ``bytes``, ``bytearray``, ``memoryview``  msgpack, or a raw frame from 1 KiB
numpy arrays of every non-object dtype             a raw frame, zero-copy (ARRAY)
numpy scalars of those dtypes                      SCALAR: dtype and raw bytes
JAX arrays (what an SPU or jax function returns)   as the numpy array they convert to
``list``, ``tuple``, ``dict`` (keys: any of       msgpack containers (TUPLE for tuples)
these that hash), ``set``, ``frozenset``            SET: a flag and the items
``pandas.DataFrame``/``Series``, ``pyarrow.Table``  TABLE: Arrow IPC in a frame (needs
                                                    pyarrow, ``pip install mpl[tables]``)
mpl's own records (SPU shares, errors)             RECORD: fields checked per annotation
=================================================  ======================================

Nothing else: no pickle, no import by name. A value of another type is refused *at the
sender* with :class:`UnsafeValueError` naming the type, where it was going and the ways out;
a pickle arriving where safe mode applies is a :class:`ProtocolError` and is never loaded.
Decoding is bounded: every array must match the frame it views (and no part of its dtype
may be of size 0, which any number of items fills: ``decoder.empty_part``; the codec
refuses such arrays in every mode, at the sender too), extension nesting stops at
``MAX_DEPTH`` and the header at ``codec.MAX_HEADER_BYTES``.

A cluster that one organisation runs end to end may declare ``trusted: true``: then results
and moves may carry any picklable object, as before. Pickles always flow from drivers to
workers (functions, and host values bound into a job): that direction is code by design.
:func:`pickles_allowed` is that rule, the one place workers and drivers ask it (a sender
asks it for its receiver: what the receiver would refuse is refused at the sender).
"""

from __future__ import annotations

import struct
from typing import Any, Final, Literal, Protocol

import msgpack

from mpl.wire.errors import ProtocolError, UnsafeValueError
from mpl.wire.limits import MAX_DEPTH, MAX_SAME_HASH, check_spread
from mpl.wire.tables import table_kind, to_ipc

__all__ = [
    "BROKER",
    "COMPLEX",
    "DRIVER",
    "EXTRA_CODES",
    "MAX_DEPTH",
    "SET",
    "TABLE",
    "WORKER",
    "Sender",
    "encode_extra",
    "host_array",
    "make_set",
    "pickles_allowed",
    "type_name",
    "unpack_complex",
    "unsafe",
]

BROKER: Final = "broker"  # who a message comes from, for pickles_allowed
DRIVER: Final = "driver"
WORKER: Final = "worker"
Sender = Literal["broker", "driver", "worker"]


def pickles_allowed(sender: Sender, *, trusted: bool, secure: bool | None = None) -> bool:
    """May a message from ``sender`` carry pickles its receiver loads? (False: it is decoded
    and encoded in the safe value format, ``safe=True``.) ``trusted`` is the receiving
    party's own choice (``trusted: true`` in its spec), never another's word.

    ==========  =====================================================================
    ``sender``  pickles allowed
    ==========  =====================================================================
    DRIVER      always: a driver this party's spec lists ships code to its workers (a
                sealed payload in secure mode; ``--code kernels`` may still refuse it)
    BROKER      what the broker sends in the clear: in plaintext (``secure=False``) it
                relays drivers' programs and inputs, so yes; in secure mode never (the
                broker is not trusted, a driver's pickles travel sealed for the worker)
    WORKER      another party's worker (a move, a result, a fetched value): only in a
                cluster declared ``trusted``
    ==========  =====================================================================

    The broker itself loads no pickle from anyone: it decodes with ``unpickle=False``.
    """
    if sender == DRIVER:
        return True
    if sender == WORKER:
        return trusted
    if sender == BROKER:
        if secure is None:
            raise ValueError("the broker's rule depends on secure mode: pass secure=")
        return not secure
    raise ValueError(f"unknown sender {sender!r}")


COMPLEX, SET, TABLE = 8, 9, 10  # codec extension codes after the codec's own 1..7
EXTRA_CODES = frozenset({COMPLEX, SET, TABLE})
_COMPLEX = struct.Struct("<dd")

_WAYS_OUT = (
    "Only the safe value format crosses between parties (None, bool, int, float, complex, "
    "str, bytes, numpy arrays and scalars, list/tuple/dict/set of these, and pandas or "
    "pyarrow tables), so that no party can make another run code. Return arrays, dicts or "
    "lists of plain values instead, or, if one organisation runs every party, declare the "
    "cluster `trusted: true` (mp.Simulator(..., trusted=True), mp.local_cluster(..., "
    "trusted=True), mpl-worker --trusted)."
)


class _Packing(Protocol):
    """What :func:`encode_extra` needs from the codec's encoder."""

    def pack(self, obj: Any) -> bytes: ...

    def add(self, buf: Any) -> int: ...


def type_name(obj: Any) -> str:
    t = type(obj)
    module = getattr(t, "__module__", "")
    return t.__qualname__ if module in ("builtins", "") else f"{module}.{t.__qualname__}"


def unsafe(obj: Any, where: str = "") -> UnsafeValueError:
    """The error for sending ``obj`` (or a value containing it) ``where``."""
    name = obj if isinstance(obj, str) else type_name(obj)
    place = f" {where}" if where else ""
    err = UnsafeValueError(f"cannot send a {name} object{place}. {_WAYS_OUT}")
    err.type_name = name
    return err


def encode_extra(obj: Any, enc: _Packing) -> msgpack.ExtType | None:
    """The extension for a complex, set or table; None for any other type."""
    t = type(obj)
    if t is complex:
        return msgpack.ExtType(COMPLEX, _COMPLEX.pack(obj.real, obj.imag))
    if t is set or t is frozenset:
        return msgpack.ExtType(SET, enc.pack([t is frozenset, list(obj)]))
    kind = table_kind(obj)
    if kind is not None:
        return msgpack.ExtType(TABLE, enc.pack([kind, enc.add(to_ipc(obj, kind))]))
    return None


def host_array(obj: Any) -> Any:
    """``obj`` as a numpy array when it is a JAX array, else None.

    JAX arrays are plain data (jax and jaxlib types with ``__array__``); the receiver gets
    the numpy array, as it would from any party that does not run jax.
    """
    module = getattr(type(obj), "__module__", "") or ""
    if module.partition(".")[0] not in ("jax", "jaxlib") or not hasattr(obj, "__array__"):
        return None
    import numpy as np

    out = np.asarray(obj)
    return None if out.dtype.hasobject else out


def unpack_complex(data: bytes) -> complex:
    if len(data) != _COMPLEX.size:
        raise ProtocolError(f"a complex number needs {_COMPLEX.size} bytes, got {len(data)}")
    real, imag = _COMPLEX.unpack(data)
    return complex(real, imag)


def make_set(spec: Any) -> set[Any] | frozenset[Any]:
    if type(spec) is not list or len(spec) != 2 or type(spec[0]) is not bool:
        raise ProtocolError("malformed set extension")
    frozen, items = spec
    if type(items) is not list:
        raise ProtocolError("malformed set extension")
    try:
        if len(items) > MAX_SAME_HASH:  # (building a set of one flooded hash is quadratic)
            check_spread(items, "set")
        return frozenset(items) if frozen else set(items)
    except TypeError as exc:
        raise ProtocolError(f"a set holds an unhashable item: {exc}") from exc
