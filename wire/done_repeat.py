"""Reading a worker's ``Done`` that repeats its last one but for the job id and the stats.

A worker answering the same program's jobs sends the broker the same ``Done`` header each
time but for two spans: the job id and the stats blob (the run's times). At world 32 the
broker reads 32 of them per job. :class:`RepeatDones` keeps the layout of the last one it
was shown read in full (:func:`mpl.wire.hot.read_done_header`, which accepts exactly what
``decode`` accepts) and reads the next by comparing every byte outside those two spans, then
reading the job id (a msgpack fixstr of the same length: valid UTF-8, as msgpack reads it)
and taking the stats blob (a bin of the same length: any bytes, as the full read takes them).
The other fields are the kept read's, which were checked when it was read: the same bytes
read to the same values. Anything else (another length, any other byte, an id that is not
UTF-8) is no repeat: the caller reads it in full.

A secure worker's Done, whose one value is a blob (a sealed box, sealed anew for every job),
has a third span (a reader made with ``boxes``): that blob's bytes, taken as they come, as
the stats are (a bin of the same length, its head among the bytes compared: any bytes, as
the full read takes them).

Kept only for a header whose bytes are msgpack's own packing of what it read (so the spans
are where the packing puts them) and whose values hold no list or map (so nothing kept is
mutable, and the nesting the full read may count cannot depend on the spans). What a repeat
reads is shared with the kept read (the values and metas maps, their items, the empty saved
list; a blob value's map is made anew for each repeat): the broker's gathering only reads
them.

One reader per sender: the bytes it compares with came from that sender's connection and
were read there; what a repeat reads depends on its bytes alone, and who may send a Done is
checked after, per message, as for any other (``mpl.broker.done_gathering``).
``tests/test_done_repeat.py`` compares it with the full read on mutated messages. Not
thread-safe: one thread reads one sender's messages.
"""

from __future__ import annotations

from typing import Any

import msgpack

from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.hot import DONE_PREFIX, DoneRead

__all__ = ["RepeatDones"]

_FIXSTR = 0xA0  # a fixstr's marker: its length in the low five bits (up to 31)
# longer Dones are read in full each time: a kept one's objects (its maps of small ints at
# worst, about 40 bytes of objects per byte) stay under 20 KB
_KEEP_BELOW = 512
# a kept layout that misses this many Dones in a row is dropped (the next Done read in full
# is kept instead); one that never matched backs off: the next Dones (up to _BACK_OFF) are
# read in full with no layout made, so a sender whose every Done differs (values that change
# each job) costs a comparison that fails and a layout's making a few times per hundred Dones
_MISSES = 8
_BACK_OFF = 64
# the first back-off after a layout that matched (or none yet) is this long, each one after
# a layout that never matched twice the last, up to _BACK_OFF: a one-off Done kept first (a
# secure session's first job, say) holds up the repeats of the Dones after it for 24
# Dones, not 72, and a sender whose every Done differs still makes a layout a few times per
# hundred
_FIRST_BACK_OFF = 16


def _pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


class RepeatDones:
    """One sender's last Done read in full, and how to read its repeats by comparison."""

    __slots__ = (
        "_back_off",
        "_blob",
        "_boxes",
        "_kept_at",
        "_misses",
        "_shape",
        "_skip",
        "_tail_at",
        "repeats",
    )

    def __init__(self, boxes: bool = False) -> None:
        """``boxes``: a Done whose one value is a blob keeps that blob's bytes out of the
        comparison (a secure worker's: its value's box is new every job); else they are
        compared with the rest (a plain blob value the same every job costs less so)."""
        self._boxes = boxes
        # the kept Done's layout: the frame up to the job id's characters, where they start
        # and end, the bytes from there up to the stats blob's, where that starts, the bytes
        # after it, the frame's size, and the kept read (None: none kept)
        self._shape: tuple[bytes, int, int, bytes, int, bytes, int, DoneRead] | None = None
        # a kept Done whose one value is a blob: where the blob's bytes start and end, the
        # bytes from there up to the stats blob's, and the value's index (the layout's
        # middle then ends where the blob starts); None: its values are compared
        self._blob: tuple[int, int, bytes, int] | None = None
        # repeats when the kept layout was made (it matched if they differ now), and its
        # misses in a row
        self._kept_at = self._misses = 0
        self._tail_at = 0  # (set with the layout)
        self._skip = 0  # Dones still to read in full before a layout is made (backing off)
        self._back_off = _FIRST_BACK_OFF  # how long the next back-off is
        self.repeats = 0  # Dones read by comparison (for tests and counts)

    def repeat(self, one: bytes) -> DoneRead | None:
        """The Done in ``one`` (a frame as received: the magic, then the header) read by
        comparison with the kept one, or None when it is no repeat of it (the caller then
        reads it in full, and may :meth:`keep` that read)."""
        shape = self._shape
        if shape is None:
            return None
        head, id_at, id_end, middle, stats_at, tail, size, kept = shape
        tail_at = self._tail_at
        blob = self._blob
        # slices compared, not startswith and endswith: their arguments' parsing costs more
        # than the copies (callgrind)
        if (
            len(one) == size
            and one[:id_at] == head
            and (
                one[id_end:stats_at] == middle
                if blob is None
                else one[id_end : blob[0]] == middle and one[blob[1] : stats_at] == blob[2]
            )
            and one[tail_at:] == tail
        ):
            try:
                job = one[id_at:id_end].decode()
            except UnicodeDecodeError:  # msgpack's str read refuses it too
                return None
            # the kept read itself, its spans this Done's: its other fields are this
            # Done's already, and its reader holds it no longer than the Done's handling
            # (the broker's gathering keeps none of it)
            kept.job, kept.stats = job, one[stats_at:tail_at]
            if blob is not None:  # the one value's bytes, as the bin holds them
                kept.values = {blob[3]: one[blob[0] : blob[1]]}
            self._misses = 0
            self.repeats += 1
            return kept
        self._misses += 1
        if self._misses >= _MISSES:  # the sender's Dones changed: kept no longer
            self._shape = self._blob = None
            if self.repeats != self._kept_at:  # it matched
                self._skip, self._back_off = 0, _FIRST_BACK_OFF
            else:
                self._skip = self._back_off
                self._back_off = min(2 * self._back_off, _BACK_OFF)
        return None

    def keep(self, one: bytes, read: DoneRead) -> None:
        """``read`` (``read_done_header``'s read of ``one``'s header) as the Done to compare
        the next ones with, when none is kept, none is being backed off from, and ``one``
        lays out as msgpack packs ``read`` (else it backs off)."""
        if self._shape is not None:  # (a Done the kept one's layout did not match)
            return
        if self._skip:
            self._skip -= 1
            return
        self._skip = _BACK_OFF  # unless a layout is made below
        values = read.values
        if (
            len(one) >= _KEEP_BELOW
            or read.saved
            or any(type(v) in (list, dict) for v in values.values())
        ):
            return
        try:
            id_len = len(read.job.encode())
            head = MAGIC_FRAME + DONE_PREFIX + _pack(read.session) + bytes([_FIXSTR | id_len])
            stats = read.stats
            middle = _pack(read.rank) + _pack(values) + _pack(stats)[: -len(stats) or None]
            tail = _pack(read.metas) + _pack(read.saved)
        except Exception:  # (what read_done_header read always packs)
            return
        id_at = len(head)
        id_end = id_at + id_len
        stats_at = id_end + len(middle)
        if (
            id_len >= 32  # no fixstr
            or len(one) != stats_at + len(stats) + len(tail)
            or not one.startswith(head)
            or one[id_at:id_end] != read.job.encode()
            or not one.startswith(middle, id_end)
            or one[stats_at : stats_at + len(stats)] != stats
            or not one.endswith(tail)
        ):
            return
        self._blob = None
        if self._boxes and len(values) == 1:
            index, value = next(iter(values.items()))
            if type(value) is bytes and value:
                # a blob (a sealed box, new every job): its bytes end the packed values (a
                # map of one item), and its bin head stays among the bytes compared
                blob_at = id_end + len(_pack(read.rank)) + len(_pack(values)) - len(value)
                blob_end = blob_at + len(value)
                if one[blob_at:blob_end] != value:  # (where msgpack's packing puts them)
                    return
                middle = one[id_end:blob_at]
                self._blob = (blob_at, blob_end, one[blob_end:stats_at], index)
        self._shape = (head, id_at, id_end, middle, stats_at, tail, len(one), read)
        self._tail_at = len(one) - len(tail)  # where the tail starts (read per repeat)
        self._misses = self._skip = 0
        self._kept_at = self.repeats  # (it matched once they differ)
