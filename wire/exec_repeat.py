"""Reading an ``Exec`` that repeats the last one but for its job id: compare, don't re-check.

A program run again and again reaches a worker as the same ``Exec`` header each time
except for the job id: the broker forwards the same session, digest, ranks, bindings,
inline outputs and timeout. :class:`RepeatExecs` keeps the last header it read in full
(:func:`mpl.wire.hot.read_exec`, which accepts exactly what ``decode`` accepts) and reads a
new one by comparing it with that header byte for byte outside the job id, and reading only
the job id (a msgpack str, valid UTF-8, as ``decode`` reads it). The other fields are the
last record's, which were checked when it was read: the same bytes decode to the same
values. Any other difference, or anything unusual about the job id, takes the full read.

One reader per sender: the bytes it compares with came from that sender's connection and
were accepted there. ``tests/test_exec_repeat.py`` compares it with ``decode`` on mutated
messages. Not thread-safe: one thread reads one sender's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.hot import EXEC_PREFIX, read_exec
from mpl.wire.jobs import Exec
from mpl.wire.limits import MAX_CONTAINERS

__all__ = ["RepeatExecs"]

_FIXSTR, _FIXSTR_END = 0xA0, 0xBF
_STR8, _STR16, _STR32 = 0xD9, 0xDA, 0xDB
_new = object.__new__


def _job_id(header: bytes, at: int, end: int) -> str | None:
    """The msgpack str at ``header[at:end]`` if it is exactly one str filling the span and
    valid UTF-8 (what msgpack's ``raw=False`` decodes), else None."""
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
    try:
        return header[start:end].decode()  # strict UTF-8, as msgpack decodes a str
    except UnicodeDecodeError:
        return None


class RepeatExecs:
    """One sender's ``Exec`` messages, read as :func:`~mpl.wire.hot.read_exec` reads them:
    the record, or None when the message is no ``Exec`` of the hot path (the caller then
    decodes it, which accepts it or says why not).

    ``repeats`` counts the messages read by comparison, ``full_reads`` the others."""

    __slots__ = ("_head", "_last", "_tail", "_tail_len", "full_reads", "repeats")

    def __init__(self) -> None:
        self._head = b""  # the last header up to its job id; empty: none remembered
        self._tail = b""  # and after it
        self._tail_len = 0
        self._last: dict[str, Any] = {}  # the last record's fields, as read
        self.repeats = 0
        self.full_reads = 0

    def read(self, frames: Sequence[Any]) -> Exec | None:
        if len(frames) != 2:
            return None
        raw = frames[1]
        header = raw.bytes if hasattr(raw, "bytes") else bytes(raw)
        head = self._head
        size = len(header)
        if head and size < MAX_CONTAINERS and header.startswith(head):  # as read_exec bounds
            at = len(head)
            end = size - self._tail_len
            first = header[at] if at < size else -1
            # a job id of up to 31 bytes (the driver's are 24): its size is in its first byte
            if _FIXSTR <= first <= _FIXSTR_END:
                job: str | None = None
                if at + 1 + (first & 0x1F) == end:
                    try:
                        job = header[at + 1 : end].decode()  # strict UTF-8, as msgpack reads
                    except UnicodeDecodeError:
                        job = None
            else:
                job = _job_id(header, at, end) if at < end else None
            if (
                job is not None
                and header.endswith(self._tail)
                and memoryview(frames[0]).tobytes() == MAGIC_FRAME
            ):
                self.repeats += 1
                fields = self._last
                msg: Exec = _new(Exec)
                msg.__dict__.update(fields)  # as read_exec builds it (no __init__)
                msg.__dict__["job"] = job
                if fields["bindings"]:  # no record shares a mutable map
                    msg.__dict__["bindings"] = dict(fields["bindings"])
                else:
                    msg.__dict__["bindings"] = {}
                return msg
        msg_read = read_exec(frames)
        if msg_read is not None:
            self.full_reads += 1
            self._remember(header, msg_read)
        return msg_read

    def _remember(self, header: bytes, msg: Exec) -> None:
        """Keep ``header`` (read in full and accepted as ``msg``) to compare the next ones
        with, cut around its job id; a header not laid out as msgpack packs it (a longer
        form of an array, tag, session or job id) is not kept."""
        head = EXEC_PREFIX + msgpack.packb(msg.session)
        job = msgpack.packb(msg.job)
        if header.startswith(head) and header.startswith(job, len(head)):
            self._head, self._tail = head, header[len(head) + len(job) :]
            self._tail_len, self._last = len(self._tail), dict(msg.__dict__)
        else:
            self._head, self._tail, self._tail_len, self._last = b"", b"", 0, {}
