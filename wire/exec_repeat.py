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
broker outside secure mode.

One reader per sender: the bytes it compares with came from that sender's connection and
were accepted there. ``tests/test_exec_repeat.py`` compares it with ``decode`` on mutated
messages. Not thread-safe: one thread reads one sender's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
from zmq import Frame

from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.hot import EXEC_PREFIX, read_exec
from mpl.wire.jobs import Exec
from mpl.wire.limits import MAX_CONTAINERS

__all__ = ["RepeatExecs"]

_FIXSTR, _FIXSTR_END = 0xA0, 0xBF
_STR8, _STR16, _STR32 = 0xD9, 0xDA, 0xDB
_new = object.__new__


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
        "_fields",
        "_head",
        "_id_at",
        "_id_byte",
        "_size",
        "_tail",
        "full_reads",
        "repeats",
    )

    def __init__(self) -> None:
        self._head = b""  # the last header up to its job id; empty: none remembered
        self._tail = b""  # and after it
        self._size = 0  # the last header's size,
        self._id_at = 0  # where its job id's bytes begin,
        self._id_byte = -1  # and the byte before them (a fixstr's, or -1)
        self._fields: dict[str, Any] = {}  # the last record's fields, as read
        self.repeats = 0
        self.full_reads = 0

    def read(self, frames: Sequence[Any]) -> Exec | None:
        msg = self.repeat(frames)
        if msg is not None:
            return msg
        read = read_exec(frames)
        if read is not None:
            self.full_reads += 1
            self._remember(raw_bytes(frames[1]), read)
        return read

    def repeat(self, frames: Sequence[Any]) -> Exec | None:
        """:meth:`read` for a repeat of the last ``Exec`` read in full, by comparison; None
        for any other message (a batch, another record, another program's ``Exec``, a
        first one), with nothing read or remembered: then :meth:`read` it (or decode it)."""
        head = self._head
        if not head or len(frames) != 2:
            return None
        magic, raw = frames
        try:
            header = raw.bytes if type(raw) is Frame else bytes(raw)
            magic_ok = memoryview(magic).tobytes() == MAGIC_FRAME
        except TypeError:  # no buffer: read_exec refuses it as well
            return None
        tail = self._tail
        if not (magic_ok and header.startswith(head) and header.endswith(tail)):
            return None
        at, size = self._id_at, len(header)
        # the common case: a job id as long as the last one (fixstr: its size is in the
        # byte before it), so at the same place in a header of the same size
        if size == self._size and header[at - 1] == self._id_byte:
            try:  # _utf8, without its call
                job: str | None = header[at : size - len(tail)].decode()
            except UnicodeDecodeError:
                job = None
        else:
            job = _job_id(header, len(head), size - len(tail))
        if job is None or size >= MAX_CONTAINERS:  # as read_exec bounds it
            return None
        self.repeats += 1
        msg: Exec = _new(Exec)  # as read_exec builds it (no __init__)
        fields = msg.__dict__
        fields.update(self._fields)
        # no record shares a mutable map with another
        fields["job"], fields["bindings"] = job, fields["bindings"].copy()
        return msg

    def _remember(self, header: bytes, msg: Exec) -> None:
        """Keep ``header`` (read in full and accepted as ``msg``) to compare the next ones
        with, cut around its job id; a header not laid out as msgpack packs it (a longer
        form of an array, tag, session or job id) is not kept, nor one with sealed bindings
        (secure mode: sealed afresh for every job, they never repeat)."""
        bindings = msg.bindings
        if bindings and any(type(b) is bytes for b in bindings.values()):
            self._head, self._tail, self._size, self._fields = b"", b"", 0, {}
            return
        head = EXEC_PREFIX + msgpack.packb(msg.session)
        job = msgpack.packb(msg.job)
        if header.startswith(head) and header.startswith(job, len(head)):
            self._head, self._tail = head, header[len(head) + len(job) :]
            self._size, self._fields = len(header), dict(msg.__dict__)
            self._id_at = len(head) + 1 if _FIXSTR <= job[0] <= _FIXSTR_END else -1
            self._id_byte = job[0] if self._id_at > 0 else -1
        else:
            self._head, self._tail, self._size, self._fields = b"", b"", 0, {}
