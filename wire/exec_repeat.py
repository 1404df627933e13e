"""Reading an ``Exec`` that repeats the last one but for its job id: compare, don't re-check.

A program run again and again reaches a worker as the same ``Exec`` header each time
except for the job id: the broker forwards the same session, digest, ranks, bindings,
inline outputs and timeout. :class:`RepeatExecs` keeps the last header it read in full
(:func:`mpl.wire.hot.read_exec`, which accepts exactly what ``decode`` accepts) and reads a
new one by comparing it with that header byte for byte outside the job id, and reading only
the job id (a msgpack str, valid UTF-8, as ``decode`` reads it). The other fields are the
last record's, which were checked when it was read: the same bytes decode to the same
values. Any other difference, or anything unusual about the job id, takes the full read.
:meth:`RepeatExecs.repeat` is the comparison alone (None for anything else, which the
caller then reads in full or decodes): the worker tries it first on every message from the
broker. :meth:`RepeatExecs.repeat_job` says a plaintext repeat by its job id alone, with
no record: the worker's inline runs need none (:attr:`RepeatExecs.last` and the id say
the job), and :meth:`RepeatExecs.record` makes the one ``repeat`` would have read.

In secure mode a job's bindings are one sealed box for this rank, sealed afresh for every
job: the header then repeats the last one but for two spans, the job id and the box's
bytes. Such a header is compared outside both: the job id is read as above, and the box is
the bytes of a msgpack bin whose header (its size) is among the bytes compared, exactly
what ``decode`` reads there. :meth:`RepeatExecs.repeat_box` says such a repeat by its job
id, rank and box, with no record. Whether the box opens is the seal's to say (``worker/
sealing.py``), for a job read either way.

A secure Exec of the header-and-boxes shape (``mpl.wire.sealed_exec``) has a plain
header, its bindings empty, and its box follows the header in the same frame:
:meth:`RepeatExecs.repeat_sealed` says its repeat by the job id, as for plaintext, and the
box by where it lies (its caller checks the magic); :meth:`RepeatExecs.repeat_sealed_frame`
says the same of the frame as received, its magic compared with the header. The broker's
loop reads a driver's repeat of that shape (a box per rank after the header) in one call,
:meth:`RepeatExecs.repeat_sealed_boxes`: the header compared and the boxes cut.

One reader per sender: the bytes it compares with came from that sender's connection and
were accepted there. ``tests/test_exec_repeat.py`` compares it with ``decode`` on mutated
messages. Not thread-safe: one thread reads one sender's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
from zmq import Frame

from mpl.wire.codec import MAGIC_FRAME, VERSION
from mpl.wire.hot import EXEC_PREFIX, read_exec
from mpl.wire.jobs import Exec
from mpl.wire.limits import MAX_CONTAINERS
from mpl.wire.msgpack_bins import BIN8, BIN16, BIN32

__all__ = ["RepeatExecs", "raw_bytes"]

_FIXSTR, _FIXSTR_END = 0xA0, 0xBF
_STR8, _STR16, _STR32 = 0xD9, 0xDA, 0xDB
_BIN_HEADER = {BIN8: 2, BIN16: 3, BIN32: 5}  # a bin's marker -> its header's size
_new = object.__new__
# mpl.wire.sealed_exec.SEALED_EXEC_MAGIC (that module reads with this one: not imported
# here; tests/test_exec_repeat.py checks they agree)
_SEALED_MAGIC = b"MPS" + bytes([VERSION])


def raw_bytes(raw: Any) -> bytes:
    """A frame's bytes (a received ``zmq.Frame``, or any buffer)."""
    return raw.bytes if type(raw) is Frame else bytes(raw)


def _job_id(header: bytes, at: int, end: int) -> str | None:
    """The msgpack str at ``header[at:end]`` if it is exactly one str filling the span and
    valid UTF-8 (what msgpack's ``raw=False`` decodes), else None."""
    if at >= end:
        return None
    first = header[at]
    if _FIXSTR <= first <= _FIXSTR_END:
        start, size = at + 1, first & 0x1F
    elif first == _STR8:
        start, size = at + 2, header[at + 1] if at + 1 < end else -1
    elif first == _STR16:
        start, size = at + 3, int.from_bytes(header[at + 1 : at + 3], "big")
    elif first == _STR32:
        start, size = at + 5, int.from_bytes(header[at + 1 : at + 5], "big")
    else:
        return None
    if start > end or start + size != end:
        return None
    return _utf8(header, start, end)


def _utf8(header: bytes, start: int, end: int) -> str | None:
    """``header[start:end]`` as msgpack's ``raw=False`` decodes a str (strict UTF-8), or
    None where it refuses it."""
    try:
        return header[start:end].decode()
    except UnicodeDecodeError:
        return None


class RepeatExecs:
    """One sender's ``Exec`` messages, read as :func:`~mpl.wire.hot.read_exec` reads them:
    the record, or None when the message is no ``Exec`` of the hot path (the caller then
    decodes it, which accepts it or says why not).

    ``repeats`` counts the messages read by comparison, ``full_reads`` the others."""

    __slots__ = (
        "_box_at",
        "_box_rank",
        "_fields",
        "_frame_at",
        "_frame_head",
        "_head",
        "_id_at",
        "_id_byte",
        "_id_end",
        "_middle",
        "_sealed_head",
        "_size",
        "_tail",
        "full_reads",
        "last",
        "repeats",
    )

    def __init__(self) -> None:
        self._head = b""  # the last header up to its job id; empty: none remembered
        self._tail = b""  # and after it
        self._size = 0  # the last header's size,
        self._id_at = 0  # where its job id's bytes begin,
        self._id_byte = -1  # and the byte before them (a fixstr's, or -1)
        # the same as received in one frame (wire v4): the magic, then the header up to
        # its job id; where the job id's bytes begin in that frame (plaintext only)
        self._frame_head = b""
        self._frame_at = 0
        # the same for a sealed Exec's frame (mpl.wire.sealed_exec: its magic, then a
        # header with no bindings, then its box), kept for a header with no bindings, up
        # to and with its job id's fixstr byte (the id's bytes begin at _frame_at)
        self._sealed_head = b""
        self._fields: dict[str, Any] = {}  # the last record's fields, as read
        # a record of them, what repeat_job compares with (its callers run it by job id)
        self.last: Exec | None = None
        # a sealed header (secure mode): the box's bytes begin at _box_at (0: none), after
        # _middle, the bytes from the job id's end at _id_end to there; _box_rank keys it
        self._box_at = 0
        self._id_end = 0
        self._middle = b""
        self._box_rank = 0
        self.repeats = 0
        self.full_reads = 0

    def read(self, frames: Sequence[Any]) -> Exec | None:
        msg = self.repeat(frames)
        if msg is not None:
            return msg
        return self.read_in_full(frames)

    def read_in_full(self, frames: Sequence[Any]) -> Exec | None:
        """:meth:`read` without the comparison (for a message :meth:`repeat` just said
        None of): read by :func:`~mpl.wire.hot.read_exec`, and kept to compare with."""
        read = read_exec(frames)
        if read is not None:
            self.full_reads += 1
            self._remember(raw_bytes(frames[1]), read)
        return read

    def repeat(self, frames: Sequence[Any]) -> Exec | None:
        """:meth:`read` for a repeat of the last ``Exec`` read in full, by comparison; None
        for any other message (a batch, another record, another program's ``Exec``, a
        first one), with nothing read or remembered: then :meth:`read` it (or decode it)."""
        if not self._box_at:  # plaintext bindings: the job id is all that differs
            job = self.repeat_job(frames)
            return None if job is None else self.record(job)
        read = self.repeat_box(frames)
        if read is None:
            return None
        job_id, rank, box = read
        sealed: Exec = _new(Exec)
        fields = sealed.__dict__
        fields.update(self._fields)
        fields["job"], fields["bindings"] = job_id, {rank: box}
        return sealed

    def repeat_box(self, frames: Sequence[Any]) -> tuple[str, int, bytes] | None:
        """:meth:`repeat` for a repeat of a sealed ``Exec`` (one box for one rank), saying
        it by ``(job id, rank, box)`` with no record: the message is :attr:`last` but for
        that id and that rank's box (the rank's key among the bytes compared). None for
        anything else (a plaintext repeat too), with nothing read or remembered.

        For a caller that needs no record of most jobs (a secure worker: the seal opens the
        box, and a job without inputs runs as :attr:`last` by its id)."""
        if not self._box_at or len(frames) != 2:
            return None
        # repeat_job's frame reading, written out as it is there: a call fewer per job
        magic, raw = frames
        try:
            if type(magic) is Frame and type(raw) is Frame:  # received (most): no memoryview
                header, magic_ok = raw.bytes, magic.bytes == MAGIC_FRAME
            else:
                header = raw.bytes if type(raw) is Frame else bytes(raw)
                magic_ok = memoryview(magic).tobytes() == MAGIC_FRAME
        except TypeError:  # no buffer: read_exec refuses it as well
            return None
        tail = self._tail
        if not (magic_ok and header.startswith(self._head) and header.endswith(tail)):
            return None
        # a sealed header: only as long as the last, job id and box alike
        at, size, box_at = self._id_at, len(header), self._box_at
        if not (
            size == self._size
            and header[at - 1] == self._id_byte
            and header.startswith(self._middle, self._id_end)
            and size < MAX_CONTAINERS
        ):
            return None
        try:
            job_id = header[at : self._id_end].decode()
        except UnicodeDecodeError:
            return None
        self.repeats += 1
        return job_id, self._box_rank, header[box_at : size - len(tail)]

    def repeat_job(self, frames: Sequence[Any]) -> str | None:
        """:meth:`repeat` for a repeat of a plaintext ``Exec`` (bindings not sealed), saying
        it by its job id alone: the message is :attr:`last` but for that id. None for
        anything else (a sealed repeat too), with nothing read or remembered.

        For a caller that needs no record of most jobs (the worker's inline runs): it
        builds one only if it must (:meth:`record`)."""
        head = self._head
        if not head or len(frames) != 2 or self._box_at:
            return None
        # the same frame reading as repeat's, written out: a call fewer per job
        magic, raw = frames
        try:
            if type(raw) is bytes and type(magic) is bytes:  # one frame the worker cut (most)
                header, magic_ok = raw, magic == MAGIC_FRAME
            elif type(magic) is Frame and type(raw) is Frame:  # received: no memoryview
                header, magic_ok = raw.bytes, magic.bytes == MAGIC_FRAME
            else:
                header = raw.bytes if type(raw) is Frame else bytes(raw)
                magic_ok = memoryview(magic).tobytes() == MAGIC_FRAME
        except TypeError:  # no buffer: read_exec refuses it as well
            return None
        tail = self._tail
        if not (magic_ok and header.startswith(head) and header.endswith(tail)):
            return None
        # the common case: a job id as long as the last one (fixstr: its size is in the
        # byte before it), so at the same place in a header of the same size
        at, size = self._id_at, len(header)
        if size == self._size and header[at - 1] == self._id_byte:
            try:  # _utf8, without its call
                job: str | None = header[at : size - len(tail)].decode()
            except UnicodeDecodeError:
                return None
        else:
            job = _job_id(header, len(head), size - len(tail))
        if job is None or size >= MAX_CONTAINERS:  # as read_exec bounds it
            return None
        self.repeats += 1
        return job

    def repeat_frame(self, data: bytes) -> str | None:
        """:meth:`repeat_job` for a message as it is received (wire v4): the magic and the
        header in one frame, ``data``. The same comparison, with the magic among the bytes
        compared; the frame is not cut in two first."""
        head = self._frame_head
        if not head:  # none remembered, or a sealed one (never kept here)
            return None
        tail = self._tail
        if not (data.startswith(head) and data.endswith(tail)):
            return None
        size = len(data)
        at = self._frame_at  # as repeat_job reads it, four bytes on
        if size == self._size + 4 and data[at - 1] == self._id_byte:
            try:
                job: str | None = data[at : size - len(tail)].decode()
            except UnicodeDecodeError:
                return None
        else:
            job = _job_id(data, len(head), size - len(tail))
        if job is None or size - 4 >= MAX_CONTAINERS:  # as read_exec bounds the header
            return None
        self.repeats += 1
        return job

    def repeat_sealed(self, data: bytes) -> tuple[str, bytes] | None:
        """:meth:`repeat_job` for a sealed Exec's frame (``mpl.wire.sealed_exec``: a header,
        its bindings empty, then one box as a msgpack bin; its caller checked the magic):
        ``(job id, box)`` if the header is :attr:`last`'s but for that id (as long as its
        own), :attr:`last` had no bindings (as the full read requires of this shape) and the
        box fills the rest, else None, with nothing read or remembered. The frame as it came
        in two parts (the worker's path for a message it did not read as one frame):
        :meth:`repeat_sealed_frame` reads it with its magic put back."""
        return self.repeat_sealed_frame(_SEALED_MAGIC + data)

    def repeat_sealed_frame(self, data: bytes) -> tuple[str, bytes] | None:
        """:meth:`repeat_sealed` for a sealed Exec's frame as it is received (wire v4): its
        magic (``mpl.wire.sealed_exec.SEALED_EXEC_MAGIC``), the header and the box in one
        frame, ``data``. The worker's reading of each secure job: one call, the header
        compared as :meth:`repeat_sealed_boxes` compares it (written out there, for the
        broker's many boxes), its one box read first, so a header counted as a repeat is
        one whose box is good too."""
        head = self._sealed_head  # (none unless the last header had no bindings)
        if not head:
            return None
        size, end = self._size + 4, len(data)  # the header's end, four bytes on
        if end <= size + 2 or end - 4 >= MAX_CONTAINERS:
            return None
        # the box: a bin8 or bin16 that ends the frame (msgpack_bins.bin_bounds written out)
        mark = data[size]
        if mark == BIN8:
            start = size + 2
            stop = start + data[size + 1]
        elif mark == BIN16:
            start = size + 3
            stop = start + int.from_bytes(data[size + 1 : start], "big")
        else:
            return None
        if stop != end or start == end:
            return None
        tail = self._tail
        if not (data.startswith(head) and data.startswith(tail, size - len(tail))):
            return None
        try:  # the job id: what lies between (_frame_at: the head's end), as decode reads it
            job = data[self._frame_at : size - len(tail)].decode()
        except UnicodeDecodeError:
            return None
        self.repeats += 1
        return job, data[start:]

    def repeat_sealed_boxes(
        self, data: bytes, magic: bytes, max_ranks: int
    ) -> tuple[Exec, list[bytes]] | None:
        """The broker's reading of a driver's sealed Exec frame as received (wire v4: its
        magic, the header, then each rank's box; ``mpl.wire.sealed_exec``) that repeats
        :attr:`last` but for the job id: the record :meth:`repeat` would read, and the
        frames the broker forwards, ``[magic, header, box, ...]`` (each box its msgpack
        bin head and all). The header is :attr:`last`'s but for the job id (as long as its
        own; :attr:`last` had no bindings), with the magic among the bytes compared; the
        boxes are cut as ``sealed_exec.read_sealed_exec`` cuts them (a bin8 or bin16 of at
        least one byte per rank, nothing after the last), for at most ``max_ranks`` ranks.
        The one reader of a repeat's boxes: ``SealedExecReaders`` reads a frame that came
        in two parts with it too. None for anything else, with nothing read or remembered
        (the caller then reads it in full)."""
        head = self._sealed_head  # (none unless the last header had no bindings)
        if not head:
            return None
        size, end = self._size + 4, len(data)  # the header's end, four bytes on
        if end <= size or end - 4 >= MAX_CONTAINERS:
            return None
        tail = self._tail
        if not (data.startswith(head) and data.startswith(tail, size - len(tail))):
            return None
        fields = self._fields
        ranks = fields["ranks"]
        if len(ranks) > max_ranks:
            return None
        raw = [magic, data[4:size]]
        box = size
        try:
            for _ in ranks:  # a plain loop: no Python call per rank
                mark = data[box]
                if mark == BIN8:
                    start = box + 2
                    stop = start + data[box + 1]
                elif mark == BIN16:
                    start = box + 3
                    stop = start + int.from_bytes(data[box + 1 : start], "big")
                else:
                    return None
                if stop == start or stop > end:
                    return None
                raw.append(data[box:stop])
                box = stop
        except IndexError:  # a bin head cut short
            return None
        if box != end:
            return None
        try:  # as repeat_sealed_frame reads it
            job = data[self._frame_at : size - len(tail)].decode()
        except UnicodeDecodeError:
            return None
        self.repeats += 1
        msg: Exec = _new(Exec)  # record(job), without its call
        msg.__dict__.update(fields)
        msg.__dict__["job"], msg.__dict__["bindings"] = job, {}
        return msg, raw

    def record(self, job: str) -> Exec:
        """The record :meth:`repeat` returns for the repeat :meth:`repeat_job` said
        ``job`` of (:attr:`last` with that job id)."""
        msg: Exec = _new(Exec)  # as read_exec builds it (no __init__)
        fields = msg.__dict__
        fields.update(self._fields)
        # no record shares a mutable map with another
        fields["job"], fields["bindings"] = job, fields["bindings"].copy()
        return msg

    def _remember(self, header: bytes, msg: Exec) -> None:
        """Keep ``header`` (read in full and accepted as ``msg``) to compare the next ones
        with, cut around its job id (and, sealed, its box); a header not laid out as
        msgpack packs it (a longer form of an array, tag, session or job id) is not kept,
        nor one whose bindings are sealed any other way than one box for one rank."""
        self._head, self._tail, self._size, self._fields = b"", b"", 0, {}
        self._box_at, self.last, self._frame_head, self._sealed_head = 0, None, b"", b""
        bindings = msg.bindings
        boxed = bool(bindings) and any(type(b) is bytes for b in bindings.values())
        head = EXEC_PREFIX + msgpack.packb(msg.session)
        job = msgpack.packb(msg.job)
        if not (header.startswith(head) and header.startswith(job, len(head))):
            return
        fixstr = _FIXSTR <= job[0] <= _FIXSTR_END
        if boxed:
            cut = _box_span(header, len(head) + len(job), bindings) if fixstr else None
            if cut is None:
                return
            box_at, box_end = cut
            id_end = len(head) + len(job)
            self._box_rank = next(iter(bindings))
            self._box_at, self._id_end = box_at, id_end
            # the box's bin header is compared with the rest: a box of the same size
            self._middle = header[id_end:box_at]
            self._head, self._tail = head, header[box_end:]
        else:
            self._head, self._tail = head, header[len(head) + len(job) :]
            self._frame_head = MAGIC_FRAME + head
            if not bindings and fixstr:  # a sealed Exec's frame's header (repeat_sealed_frame)
                # up to the job id's bytes: its fixstr byte (its size) is compared with the
                # rest, so the id lies between this head and the tail
                self._sealed_head = _SEALED_MAGIC + head + job[:1]
        self._size, self._fields = len(header), dict(msg.__dict__)
        self.last = self.record(msg.job)
        self._id_at = len(head) + 1 if fixstr else -1
        self._id_byte = job[0] if fixstr else -1
        self._frame_at = self._id_at + len(MAGIC_FRAME) if fixstr else -1


def _box_span(header: bytes, at: int, bindings: dict[int, Any]) -> tuple[int, int] | None:
    """Where the bytes of the one sealed box in ``bindings`` lie in ``header`` (whose
    digest begins at ``at``), as a msgpack bin: None unless there is exactly one, a bin
    the walk finds where the bindings' single value is."""
    if len(bindings) != 1:
        return None
    unpacker = msgpack.Unpacker(None, raw=False, strict_map_key=False)
    unpacker.feed(header[at:])
    try:
        unpacker.skip()  # the digest
        unpacker.skip()  # the ranks
        if unpacker.read_map_header() != 1:
            return None
        unpacker.skip()  # the rank
        start = at + unpacker.tell()
        unpacker.skip()  # the box
        end = at + unpacker.tell()
    except Exception:
        return None
    size = _BIN_HEADER.get(header[start], 0)
    if not size or header[start + size : end] != next(iter(bindings.values())):
        return None
    return start + size, end
