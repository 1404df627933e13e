"""The programs a client has sent the broker, by digest: a bounded memory.

A job names its program by digest; the client sends the program itself first unless it
remembers having sent it. Every distinct program is a new digest (a secure ``mp.save``
of a new name is one: the name is in its op), so an unbounded set would grow for as long
as the client runs. This one keeps the newest :data:`PROGRAMS_KEPT` (as many as the
broker caches, ``mpl.broker.state``): a forgotten digest only means the program is sent
again before its next job, which the broker keeps as it kept the first. A membership test
is a dict's (the job sites' hot path reads it on every job); a hit does not reorder, so
the oldest sent goes first, and a program sent again is the newest once more.
"""

from __future__ import annotations

__all__ = ["PROGRAMS_KEPT", "SentPrograms"]

PROGRAMS_KEPT = 1024


class SentPrograms(dict[str, None]):
    """Digests of programs sent (keys, oldest first), at most ``limit``. Shared by the
    calling threads and the submit pump: each operation holds up under another thread's."""

    def __init__(self, limit: int = PROGRAMS_KEPT) -> None:
        super().__init__()
        self.limit = limit

    def add(self, digest: str) -> None:
        self.pop(digest, None)  # sent again: the newest
        self[digest] = None
        if len(self) > self.limit:
            try:
                oldest = next(iter(self))
            except (StopIteration, RuntimeError):  # another thread changed it just now
                return
            self.pop(oldest, None)

    def discard(self, digest: str) -> None:
        self.pop(digest, None)
