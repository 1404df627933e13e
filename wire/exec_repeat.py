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
from mpl.wire.record import built

__all__ = ["RepeatExecs"]

_FIXSTR, _FIXSTR_END = 0xA0, 0xBF
_STR8, _STR16, _STR32 = 0xD9, 0xDA, 0xDB


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

    __slots__ = ("_head", "_last", "_tail", "full_reads", "repeats")

    def __init__(self) -> None:
        self._head = b""  # the last header up to its job id; empty: none remembered
        self._tail = b""  # and after it
        self._last: Exec | None = None
        self.repeats = 0
        self.full_reads = 0

    def read(self, frames: Sequence[Any]) -> Exec | None:
        if len(frames) != 2:
            return None
        header = frames[1].bytes if hasattr(frames[1], "bytes") else bytes(frames[1])
        head, tail, last = self._head, self._tail, self._last
        if (
            last is not None
            and len(header) > len(head) + len(tail)
            and len(header) < MAX_CONTAINERS  # as read_exec bounds it
            and header.startswith(head)
            and header.endswith(tail)
            and memoryview(frames[0]).tobytes() == MAGIC_FRAME
        ):
            job = _job_id(header, len(head), len(header) - len(tail))
            if job is not None:
                self.repeats += 1
                bindings = last.bindings
                return built(
                    Exec,
                    last.session,
                    job,
                    last.digest,
                    last.ranks,
                    dict(bindings) if bindings else {},  # no record shares a mutable map
                    last.inline,
                    last.timeout_s,
                )
        msg = read_exec(frames)
        if msg is not None:
            self.full_reads += 1
            self._remember(header, msg)
        return msg

    def _remember(self, header: bytes, msg: Exec) -> None:
        """Keep ``header`` (read in full and accepted as ``msg``) to compare the next ones
        with, cut around its job id; a header not laid out as msgpack packs it (a longer
        form of an array, tag, session or job id) is not kept."""
        head = EXEC_PREFIX + msgpack.packb(msg.session)
        job = msgpack.packb(msg.job)
        if header.startswith(head) and header.startswith(job, len(head)):
            self._head, self._tail, self._last = head, header[len(head) + len(job) :], msg
        else:
            self._head, self._tail, self._last = b"", b"", None
