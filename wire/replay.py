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

Bounded memory: ``STREAMS`` streams per driver (the drivers are the spec's), least recently
used out first, so one driver's clients cannot push another driver's streams out. A stream
the guard does not know starts only below ``WINDOW`` (a client's first Execs): a stream it
forgot (a worker restart, or ``STREAMS`` newer streams of the same driver since its last
job) can have at most its first ``WINDOW`` Execs replayed, once, never any later one; and a
client whose stream was forgotten has that job refused, and the refusal (its ``op`` is
``UNKNOWN_STREAM``) makes the client start a new stream for that node: its next job runs.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

from mpl.wire.sealed import BOX_MAGIC, Sealed

__all__ = ["STREAMS", "UNKNOWN_STREAM", "WINDOW", "ReplayGuard", "stamp"]

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
                "worker does not know (a replay, or the worker restarted or forgot the "
                "stream: the driver starts a new one)"
            )
        streams = self._senders.setdefault(sender, OrderedDict())
        ran = bytearray(self.window)
        ran[seq & self._slot] = 1
        streams[epoch] = [seq, ran]
        if len(streams) > self.streams:
            streams.popitem(last=False)
        return ""

    def streams_of(self, sender: str) -> int:
        """How many streams of ``sender`` are remembered (for tests and status)."""
        return len(self._senders.get(sender, ()))
