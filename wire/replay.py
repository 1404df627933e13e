"""A worker's memory of the sealed Execs it has run, bounded however many it runs: a sliding
window of sequence numbers per *stream*. No I/O.

A stream is one sealing process's (one driver client's) Execs for one node: a driver seals
each rank's bindings under its epoch for that rank's node and numbers them with the epoch's
counter (``mpl.wire.seal``). The number is the nonce of a compact box, or the second half
of a ``Sealed`` record's salt, whose first half is the epoch's first 8 bytes; both are
authenticated (the box's nonce by its tag, the salt by the key it derives), and so is the
sender, so a stream is (the authenticated sender, those 8 epoch bytes). Streams never
collide: several clients of one driver (one process may hold several) have epochs of their
own, and sessions do not matter (a stream spans every session its client uses, so a session
closed and forgotten by the worker is no way round it).

Per stream the guard keeps the highest number run and whether each of the ``WINDOW``
numbers up to it ran (a ring of bytes, one slot per number: 4 KiB): a number above it runs
(the window slides up), one within it runs once (threads of one client seal and send
concurrently, so Execs arrive a little out of order), one below the window is refused (too
old to tell from a replay).

What the guard forgot cannot be replayed either:

* **A restart.** A new worker process remembers no stream, but every Exec names the process
  it was sealed for: the context of each rank's bindings ends with that worker's public
  incarnation (``mpl.wire.incarnation``, new per process start), so nothing sealed before
  the restart opens after it. A driver learns incarnations from the broker's
  ``SessionOpened``; an Exec that does not open, of a stream the worker does not know, is
  refused with ``op`` ``UNKNOWN_STREAM`` and the worker's own incarnation (and floor) at
  the end of the message (:func:`refusal_facts`): the driver then seals for that worker,
  under a new epoch, and its next job runs; the refused job itself is sent once more only
  when it opened nowhere (``DriverSeal.refused``: a job of that rank alone, sealed for no
  incarnation, as for a worker that joined after the session opened). After a restart the
  refusal is the job's error: it is not sealed, so a broker could forge it for a job the
  process before ran.
* **Eviction.** Bounded memory: ``STREAMS`` streams per driver (the drivers are the
  spec's), least recently used out first, so one driver's clients cannot push another
  driver's streams out. A stream's epoch starts with its start time, the sealing
  process's clock in ms (:func:`epoch_start`; authenticated as the rest of the epoch), and
  the guard keeps, per driver, the latest start of a stream it forgot: its *floor* (one
  number per driver). A stream it does not know that started at or below the floor is
  refused (``UNKNOWN_STREAM``, the floor in the refusal), and the driver's next epoch for
  that worker starts above it, whatever its clock says.

A stream the guard does not know, above the floor, is one this process never saw: it is
admitted from its first numbers (below ``WINDOW``; past them it is refused too and the
driver starts a new one). A broker lying about incarnations (in ``SessionOpened``, or in a
forged refusal) or floors can make a driver seal what the worker refuses, never make
anything run twice: the worker's floors come from its own evictions only, and it opens
only what was sealed for its own incarnation.
"""

from __future__ import annotations

import re
import secrets
import struct
import threading
import time
from collections import OrderedDict
from typing import Any

from mpl.wire.sealed import BOX_MAGIC, Sealed

__all__ = [
    "FLOOR_MAX",
    "STREAMS",
    "UNKNOWN_STREAM",
    "WINDOW",
    "ReplayGuard",
    "claimed_stream",
    "epoch_start",
    "epoch_time",
    "read_refusal",
    "refusal_facts",
    "stamp",
]

WINDOW = 4096  # sequence numbers per stream below the highest run: reordering tolerated
STREAMS = 1024  # streams kept per driver
_EPOCH = 16  # a box's epoch bytes, after its sender; a record's salt is as long
_LEN_AT = len(BOX_MAGIC)  # where a box's sender length byte is
_BOX_HEAD = _LEN_AT + 1 + _EPOCH  # a box's head but for its sender's name
# from a box's epoch on: its first half (the stream), its second, its 12-byte number
_unpack_box = struct.Struct(">8s8xIQ").unpack_from
# The ``op`` of a worker's refusal of a stream it does not know (past its first WINDOW
# numbers): the driver then seals for that node under a new epoch (DriverSeal.refused).
UNKNOWN_STREAM = "stream"
# An epoch's first 8 bytes: its start in ms since 1970 (42 bits: until 2109), then 22 random
# bits, so streams of one driver's processes that start in the same ms (or above the same
# floor) still differ; one process never draws one ms twice.
_RANDOM_BITS = 22
FLOOR_MAX = 1 << 63  # a floor a driver takes (the epoch above it fits in 8 bytes)
_drawn = [0]  # the latest ms this process started an epoch at
_drawing = threading.Lock()


def epoch_start(floor: int = -1) -> bytes:
    """The first 8 bytes of a new epoch, as a number: its start time (this process's clock,
    in ms; a later ms than any epoch this process started before), then random bits;
    always above ``floor``. Streams of one sender are so ordered by when they started, as a
    worker's floor needs."""
    with _drawing:  # rare (an epoch per recipient and client): threads may draw at once
        ms = _drawn[0] = max(
            time.time_ns() // 1_000_000, (floor >> _RANDOM_BITS) + 1, _drawn[0] + 1
        )
    return (ms << _RANDOM_BITS | secrets.randbits(_RANDOM_BITS)).to_bytes(8, "big")


def epoch_time(epoch: bytes) -> int:
    """The time an epoch (or a stream: its first 8 bytes) started, as :func:`epoch_start`
    wrote it."""
    return int.from_bytes(epoch[:8], "big")


# What a worker adds to a refusal of a stream (op UNKNOWN_STREAM) for the driver: its public
# incarnation, and the floor of the sender's streams ("-1": none or unknown). In the
# message, as the error record has no field for it: read_refusal reads it back.
_FACTS = " (this worker: incarnation {}, stream floor {})"
_FACTS_READ = re.compile(
    r" \(this worker: incarnation ([0-9a-f]{0,64}), stream floor (-1|\d{1,20})\)\Z"
)


def refusal_facts(incarnation: str, floor: int) -> str:
    """What ends the message of a worker's refusal of a stream: see :func:`read_refusal`."""
    return _FACTS.format(incarnation, floor)


def read_refusal(message: str) -> tuple[str | None, int]:
    """``(worker's public incarnation, floor)`` from a stream refusal's message; ``(None,
    -1)`` when it holds none (an older worker). Only hints, through the broker: a wrong one
    makes the driver seal what that worker refuses again, never what runs twice."""
    found = _FACTS_READ.search(message)
    if found is None:
        return None, -1
    return found[1], int(found[2])


def claimed_stream(sealed: object) -> tuple[str, bytes] | None:
    """``(sender, stream epoch)`` a sealed payload *claims* (not authenticated: for a
    refusal's facts only), or None when it is malformed."""
    if type(sealed) is Sealed:
        return sealed.sender, sealed.salt[: _EPOCH // 2]
    if type(sealed) is not bytes or len(sealed) <= _LEN_AT or not sealed.startswith(BOX_MAGIC):
        return None
    end = _LEN_AT + 1 + sealed[_LEN_AT]
    if len(sealed) < end + _EPOCH:
        return None
    return sealed[_LEN_AT + 1 : end].decode(errors="replace"), sealed[end : end + _EPOCH // 2]


def stamp(sealed: object) -> tuple[bytes, int]:
    """``(stream epoch, sequence number)`` of an authenticated Exec's sealed bindings (a
    compact box or a ``Sealed``)."""
    if type(sealed) is bytes:
        end = _LEN_AT + 1 + sealed[_LEN_AT] + _EPOCH
        return sealed[end - _EPOCH : end - _EPOCH // 2], int.from_bytes(sealed[end : end + 12])
    if type(sealed) is not Sealed:
        raise TypeError(f"not a sealed payload: {type(sealed).__name__}")
    return sealed.salt[: _EPOCH // 2], int.from_bytes(sealed.salt[_EPOCH // 2 :])


class ReplayGuard:
    """Which sealed Execs may still run here: each one once, in a window per stream."""

    def __init__(self, window: int = WINDOW, streams: int = STREAMS) -> None:
        self.window = window
        self.streams = streams
        if window & (window - 1):
            raise ValueError("the window is a power of two")
        self._slot = window - 1  # a number's slot in its stream's ring: its low bits
        # sender -> stream epoch -> [highest number run, ring: whether each of the window's
        # numbers ran, at the number's slot]
        self._senders: dict[str, OrderedDict[bytes, list[Any]]] = {}
        # sender -> the latest time (epoch_time) of its streams forgotten here: one at or
        # below it is one this guard may have forgotten, never admitted again
        self._floors: dict[str, int] = {}

    def admit(self, sender: str, sealed: object) -> str:
        """``""`` if the Exec whose bindings are ``sealed`` (authenticated: sealed by
        ``sender``) may run, and it is counted as run; otherwise why it may not."""
        if type(sealed) is bytes:  # a compact box (most jobs): stamp() without its call
            epoch, top, seq = _unpack_box(sealed, sealed[_LEN_AT] + _BOX_HEAD - _EPOCH)
            if top:  # a number past 2**64: no sealer counts that far
                seq = top << 64 | seq
        else:
            epoch, seq = stamp(sealed)
        try:
            streams = self._senders[sender]
            window = streams[epoch]
        except KeyError:
            return self._start(sender, epoch, seq)
        streams.move_to_end(epoch)
        high, ran = window
        if seq > high:  # most jobs: the next number
            window[0] = seq
            if seq - high > 1:  # numbers skipped (sent out of order): not run yet
                self._skip(ran, high, seq)
            ran[seq & self._slot] = 1
            return ""
        if high - seq >= self.window:
            behind = high - seq
            return f"an Exec of {sender} {behind} behind its stream's newest: too old, or a replay"
        if ran[seq & self._slot]:
            return f"an Exec of {sender} that already ran here: a replay"
        ran[seq & self._slot] = 1
        return ""

    def _skip(self, ran: bytearray, high: int, seq: int) -> None:
        """The window moves up from ``high`` to ``seq``: the slots of the numbers between
        (entering it) are cleared of the numbers leaving it."""
        if seq - high >= self.window:
            ran[:] = bytes(self.window)
            return
        lo, hi = (high + 1) & self._slot, seq & self._slot
        if lo <= hi:
            ran[lo:hi] = bytes(hi - lo)
        else:  # round the ring's end
            ran[lo:] = bytes(self.window - lo)
            ran[:hi] = bytes(hi)

    def _start(self, sender: str, epoch: bytes, seq: int) -> str:
        """Admit the first Exec of a stream not (or no longer) known, if it can be one of
        the stream's first."""
        if seq >= self.window:
            return (
                f"{UNKNOWN_STREAM}: an Exec numbered {seq} of a stream of {sender} this "
                "worker does not know (a replay, or the worker forgot the stream: the "
                "driver starts a new one)"
            )
        floor = self._floors.get(sender, -1)
        if epoch_time(epoch) <= floor:
            return (
                f"{UNKNOWN_STREAM}: an Exec of a stream of {sender} started at or before "
                "the latest one this worker forgot (a replay, or a stream it forgot: the "
                "driver starts a new one, above that floor)"
            )
        streams = self._senders.setdefault(sender, OrderedDict())
        ran = bytearray(self.window)
        ran[seq & self._slot] = 1
        streams[epoch] = [seq, ran]
        if len(streams) > self.streams:
            gone = epoch_time(streams.popitem(last=False)[0])
            if gone > floor:
                self._floors[sender] = gone
        return ""

    def stream(self, sender: str, epoch: bytes) -> tuple[OrderedDict[bytes, list[Any]], list[Any]]:
        """``(sender's streams, the stream's window)`` of a stream known here (KeyError
        otherwise): for a caller that admits a stream's next number itself, as :meth:`admit`
        does (``window[0] = seq``, ``window[1][seq & (window_size - 1)] = 1``, the stream
        moved to the end of the streams), when ``seq`` is exactly one above ``window[0]``
        (no slot to clear), and only while ``epoch`` is still among the streams (a stream
        evicted since is admitted by :meth:`admit` alone, which refuses it)."""
        streams = self._senders[sender]
        return streams, streams[epoch]

    def knows(self, sender: str, epoch: bytes) -> bool:
        """Whether a stream (``sender``, ``epoch``: its first 8 bytes) is remembered here."""
        return epoch in self._senders.get(sender, ())

    def floor(self, sender: str) -> int:
        """The time of the latest stream of ``sender`` forgotten here (-1: none): a stream
        not known that started at or before it is refused."""
        return self._floors.get(sender, -1)

    def streams_of(self, sender: str) -> int:
        """How many streams of ``sender`` are remembered (for tests and status)."""
        return len(self._senders.get(sender, ()))
