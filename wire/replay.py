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

Per stream the guard keeps the highest number run and a bitmap of the ``WINDOW`` numbers
below it: a number above it runs (the window slides up), one within it runs once (threads
of one client seal and send concurrently, so Execs arrive a little out of order), one below
the window is refused (too old to tell from a replay).

Bounded memory: ``STREAMS`` streams per driver (the drivers are the spec's), least recently
used out first, so one driver's clients cannot push another driver's streams out. A stream
the guard does not know starts only below ``WINDOW`` (a client's first Execs): a stream it
forgot (a worker restart, or ``STREAMS`` newer streams of the same driver since its last
job) can have at most its first ``WINDOW`` Execs replayed, once, never any later one; and a
client whose stream was forgotten has that job refused, and the refusal (its ``op`` is
``UNKNOWN_STREAM``) makes the client start a new stream for that node: its next job runs.
"""

from __future__ import annotations

from collections import OrderedDict

from mpl.wire.sealed import BOX_MAGIC, Sealed

__all__ = ["STREAMS", "UNKNOWN_STREAM", "WINDOW", "ReplayGuard", "stamp"]

WINDOW = 4096  # sequence numbers per stream below the highest run: reordering tolerated
STREAMS = 1024  # streams kept per driver
_EPOCH = 16  # a box's epoch bytes, after its sender; a record's salt is as long
_LEN_AT = len(BOX_MAGIC)  # where a box's sender length byte is
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
        self._mask = (1 << window) - 1
        # sender -> stream epoch -> [highest number run, bitmap: bit d is number high - d]
        self._senders: dict[str, OrderedDict[bytes, list[int]]] = {}

    def admit(self, sender: str, sealed: object) -> str:
        """``""`` if the Exec whose bindings are ``sealed`` (authenticated: sealed by
        ``sender``) may run, and it is counted as run; otherwise why it may not."""
        if type(sealed) is bytes:  # a compact box (most jobs): stamp() without its call
            end = _LEN_AT + 1 + sealed[_LEN_AT] + _EPOCH
            epoch, seq = sealed[end - _EPOCH : end - 8], int.from_bytes(sealed[end : end + 12])
        else:
            epoch, seq = stamp(sealed)
        streams = self._senders.get(sender)
        if streams is None:
            streams = self._senders[sender] = OrderedDict()
        window = streams.get(epoch)
        if window is None:
            if seq >= self.window:
                return (
                    f"{UNKNOWN_STREAM}: an Exec numbered {seq} of a stream of {sender} this "
                    "worker does not know (a replay, or the worker restarted or forgot the "
                    "stream: the driver starts a new one)"
                )
            streams[epoch] = [seq, 1]
            if len(streams) > self.streams:
                streams.popitem(last=False)
            return ""
        streams.move_to_end(epoch)
        high, seen = window
        if seq > high:
            window[0] = seq
            window[1] = ((seen << (seq - high)) | 1) & self._mask if seq - high < self.window else 1
            return ""
        behind = high - seq
        if behind >= self.window:
            return f"an Exec of {sender} {behind} behind its stream's newest: too old, or a replay"
        bit = 1 << behind
        if seen & bit:
            return f"an Exec of {sender} that already ran here: a replay"
        window[1] = seen | bit
        return ""

    def streams_of(self, sender: str) -> int:
        """How many streams of ``sender`` are remembered (for tests and status)."""
        return len(self._senders.get(sender, ()))
