"""A rank's run stats as one opaque blob: packed once by the worker, read only when wanted.

Every ``Done`` carries its rank's stats (the run's seconds, its wall-clock start, one span
per op), and the ``JobResult`` carries every rank's. Nobody on the job's path reads them:
the broker copies each blob byte for byte into the answer, and the driver keeps them with
the job's record until a trace (``mp.trace``) or the broker's timeline asks. So they travel
as one ``bytes`` field (a msgpack bin inside the header) instead of a map and a list per op
that the broker would unpack and repack and the driver decode on every job.

The blob is msgpack ``[run_s, started, ops, dropped]``: ``ops`` a list of
``[op index, label, start s, end s]`` relative to ``started`` (wall clock), ``dropped`` the
spans left out to keep the blob within :data:`MAX_STATS_BYTES` (the worker packs it so;
the broker refuses a longer one). A reader takes more trailing items as they come, so the
layout may grow at the end.

Trust: a blob comes from a party through a possibly hostile broker. :func:`read_stats`
decodes it with msgpack alone (no extension hook, no object hook: nothing runs), within
the size cap, and checks its shape; anything else raises :class:`ProtocolError` where it is
read, never where the job's result is.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

import msgpack

from mpl.wire.decoder import BUFFER, Opaque
from mpl.wire.errors import ProtocolError

__all__ = [
    "MAX_STATS_BYTES",
    "TIMES_BYTES",
    "RunStats",
    "pack_stats",
    "read_stats",
    "read_times",
    "run_seconds",
    "stats_blob",
]

# per rank and job; 2,000 spans with short labels fit many times over (MAX_SPANS, worker)
MAX_STATS_BYTES = 256 * 1024
# the bytes a blob's run_s and started fit in: its array's header and two msgpack numbers
# (9 bytes at most each); what a reader of the times alone keeps of a blob
TIMES_BYTES = 1 + 9 + 9
_HEAD = b"\x94\xcb"  # a fixarray of four, then run_s as a float64: how pack_stats begins
_FLOAT = struct.Struct(">d")


@dataclass(frozen=True)
class RunStats:
    """One rank's stats for one job, as :func:`read_stats` found them."""

    run_s: float
    started: float  # wall clock at the worker
    ops: list[tuple[int, str, float, float]]  # (op index, label, start s, end s)
    dropped: int = 0  # spans the worker left out to keep within MAX_STATS_BYTES


class _Packer(threading.local):
    """A packer per thread (jobs finish on the I/O thread and on job threads): making one
    costs more than packing a trivial job's stats with it."""

    def __init__(self) -> None:
        self.pack = _packer()


def _packer() -> Any:
    return msgpack.Packer(use_bin_type=True, autoreset=True).pack


_tls = _Packer()


def pack_stats(run_s: float, started: float, ops: list[list[Any]]) -> bytes:
    """The blob of a run (the worker's: ``ops`` as its interpreter records them), at most
    :data:`MAX_STATS_BYTES`: spans are left out from the end (and counted) to fit."""
    try:
        blob: bytes = _tls.pack([run_s, started, ops, 0])
    except Exception:
        _tls.pack = _packer()  # never reuse a packer that failed mid-way
        raise
    kept = len(ops)
    while len(blob) > MAX_STATS_BYTES and kept:
        kept = kept * MAX_STATS_BYTES // len(blob) * 9 // 10  # a tenth to spare, then check
        blob = _tls.pack([run_s, started, ops[:kept], len(ops) - kept])
    return blob


def run_seconds(blob: bytes) -> float:
    """The run's seconds from a blob this process packed (:func:`pack_stats`), read from
    its fixed start without decoding the rest."""
    if blob[:2] == _HEAD and len(blob) >= 10:
        seconds: float = _FLOAT.unpack_from(blob, 2)[0]
        return seconds
    return read_stats(blob).run_s


def stats_blob(value: Any) -> bytes | None:
    """A Done's stats as the bytes they came in: the blob itself, or (a blob of 1 KiB or
    more, which the codec sends in a frame of its own) the frame a broker's decode kept as
    an ``Opaque`` buffer; None for anything else."""
    if type(value) is bytes:
        return value
    if type(value) is Opaque and value.code == BUFFER and value.head == [0]:
        try:
            return memoryview(value.buffer).tobytes()
        except TypeError:
            return None
    return None


def read_stats(blob: Any) -> RunStats:
    """Decode one rank's stats blob, bounded and code-free; :class:`ProtocolError` saying
    why for anything that is not what :func:`pack_stats` writes."""
    if type(blob) is not bytes:
        raw = stats_blob(blob)
        if raw is None:
            raise ProtocolError(f"stats unreadable: a {type(blob).__name__}, not bytes")
        blob = raw
    if not blob:
        raise ProtocolError("stats unreadable: none sent (or dropped by the broker)")
    if len(blob) > MAX_STATS_BYTES:
        raise ProtocolError(f"stats unreadable: {len(blob)} bytes, over {MAX_STATS_BYTES}")
    try:
        # msgpack alone: no hooks, so extension types come back as ExtType (refused below)
        # and nothing runs; each length is bounded by the blob's own size
        items = msgpack.unpackb(
            blob,
            raw=False,
            strict_map_key=False,
            max_str_len=MAX_STATS_BYTES,
            max_bin_len=MAX_STATS_BYTES,
            max_array_len=MAX_STATS_BYTES,
            max_map_len=MAX_STATS_BYTES,
            max_ext_len=MAX_STATS_BYTES,
        )
    except Exception as exc:  # msgpack's errors (a truncated blob, one nested too deep)
        raise ProtocolError(f"stats unreadable: {type(exc).__name__}: {exc}") from None
    if type(items) is not list or len(items) < 4:
        raise ProtocolError("stats unreadable: not [run_s, started, ops, dropped]")
    run_s, started, ops, dropped = items[:4]
    if not (_number(run_s) and _number(started) and type(ops) is list and type(dropped) is int):
        raise ProtocolError("stats unreadable: a field of the wrong type")
    spans: list[tuple[int, str, float, float]] = []
    for span in ops:
        if not (
            type(span) is list
            and len(span) == 4
            and type(span[0]) is int
            and type(span[1]) is str
            and _number(span[2])
            and _number(span[3])
        ):
            raise ProtocolError("stats unreadable: an op span is not [index, label, start, end]")
        spans.append((span[0], span[1], float(span[2]), float(span[3])))
    return RunStats(float(run_s), float(started), spans, dropped)


def read_times(head: bytes) -> tuple[float, float]:
    """``(started, run_s)`` from the first :data:`TIMES_BYTES` of a blob (or more): what a
    reader that keeps no more of it (the broker's timeline) can know. Plain msgpack, no
    hooks, within ``head``; :class:`ProtocolError` if they are not two numbers there."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=TIMES_BYTES)
    unpacker.feed(head[:TIMES_BYTES])
    try:
        length = unpacker.read_array_header()
        run_s, started = unpacker.unpack(), unpacker.unpack()
    except Exception as exc:  # not an array, or cut short before its second item
        raise ProtocolError(f"stats unreadable: {type(exc).__name__}") from None
    if length < 4 or not (_number(run_s) and _number(started)):
        raise ProtocolError("stats unreadable: not [run_s, started, ops, dropped]")
    return float(started), float(run_s)


def _number(value: Any) -> bool:
    return type(value) is float or type(value) is int
