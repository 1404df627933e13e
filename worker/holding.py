"""Where traffic for work this worker has not been told about waits, briefly and bounded.

A peer's move (or SPU message) can overtake the broker's ``Exec`` that tells this worker
about the job, so traffic for an unknown job cannot simply be refused. But anyone who can
reach the data socket could also send traffic for jobs that will never exist, so it is held
apart from the genuine traffic, at most ``max_entries`` items and ``max_bytes`` bytes, for
at most ``hold_s`` seconds. What does not fit is dropped and counted (``dropped``); genuine
traffic, for work the worker knows, never waits here and is never refused for lack of room.
When the worker learns of the work, :meth:`release` hands its held items over.

Not thread-safe: the mailbox that owns it calls it under its own lock.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["HOLD_BYTES", "HOLD_ENTRIES", "HOLD_S", "Holding", "approx_nbytes"]

HOLD_ENTRIES = 1024
HOLD_BYTES = 256 * 1024 * 1024
HOLD_S = 10.0
_OTHER = 64  # what a value of no known size is counted as


def approx_nbytes(value: Any, depth: int = 0) -> int:
    """A cheap estimate of the memory ``value`` holds (arrays and buffers exactly)."""
    nbytes = getattr(value, "nbytes", None)  # numpy arrays, memoryviews, zmq frames
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if depth < 4 and isinstance(value, (list, tuple)):
        return _OTHER + sum(approx_nbytes(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return _OTHER + sum(
            approx_nbytes(k, depth + 1) + approx_nbytes(v, depth + 1) for k, v in value.items()
        )
    return max(_OTHER, sys.getsizeof(value, _OTHER)) if depth < 4 else _OTHER


class _Group:
    __slots__ = ("arrived", "items", "nbytes")

    def __init__(self, arrived: float) -> None:
        self.arrived = arrived
        self.items: dict[Hashable, Any] = {}
        self.nbytes = 0


class Holding:
    """Items by group (a job, an SPU lane) and key, within bounds, oldest group first out."""

    def __init__(
        self,
        *,
        max_entries: int = HOLD_ENTRIES,
        max_bytes: int = HOLD_BYTES,
        hold_s: float = HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hold_s = hold_s
        self._clock = clock
        self._groups: dict[Hashable, _Group] = {}  # in order of first arrival
        self.entries = 0
        self.nbytes = 0
        self.dropped = 0

    def hold(self, group: Hashable, key: Hashable, value: Any) -> bool:
        """Keep ``value``; False (and counted as dropped) when it does not fit or ``key``
        is already held."""
        self._expire()
        held = self._groups.get(group)
        if held is not None and key in held.items:
            return False
        size = approx_nbytes(value)
        if self.entries + 1 > self.max_entries or self.nbytes + size > self.max_bytes:
            self.dropped += 1
            return False
        if held is None:
            held = self._groups[group] = _Group(self._clock())
        held.items[key] = (value, size)
        held.nbytes += size
        self.entries += 1
        self.nbytes += size
        return True

    def holds(self, group: Hashable, key: Hashable) -> bool:
        held = self._groups.get(group)
        return held is not None and key in held.items

    def release(self, group: Hashable) -> list[tuple[Hashable, Any]]:
        """Hand over (and forget) what is held for ``group``, in arrival order."""
        held = self._groups.pop(group, None)
        if held is None:
            return []
        self.entries -= len(held.items)
        self.nbytes -= held.nbytes
        return [(key, value) for key, (value, _size) in held.items.items()]

    def forget(self, which: Callable[[Hashable], bool]) -> None:
        """Drop every group ``which`` selects (a session closed, a lane dropped)."""
        for group in [g for g in self._groups if which(g)]:
            self.release(group)

    def _expire(self) -> None:
        limit = self._clock() - self.hold_s
        while self._groups:
            group, held = next(iter(self._groups.items()))
            if held.arrived > limit:
                return
            self.dropped += len(held.items)
            self.release(group)
