"""Copies of a daemon's state for other threads (its metrics server), made by its I/O loop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SnapshotSlot"]


class SnapshotSlot:
    """Hands a copy of a daemon's state from its I/O loop to other threads.

    A reader calls :meth:`get`, which waits (bounded) until the loop calls :meth:`serve`;
    the loop calls :meth:`serve` on every tick and builds a copy only when one is wanted.
    """

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        # a loop that may sleep long between ticks (an idle worker) is woken by this
        self._wake = wake
        self._cond = threading.Condition()
        self._wanted = False
        self._gen = 0
        self._value: dict[str, Any] = {}

    def get(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The next snapshot the loop makes, or None if it makes none within ``timeout``."""
        with self._cond:
            gen = self._gen
            self._wanted = True
            if self._wake is not None:
                self._wake()
            if not self._cond.wait_for(lambda: self._gen > gen, timeout):
                return None
            return self._value

    def serve(self, build: Callable[[], dict[str, Any]]) -> None:
        """From the I/O loop: build a snapshot if a reader waits for one."""
        if not self._wanted:  # the common case: one attribute read
            return
        value = build()
        with self._cond:
            self._value = value
            self._wanted = False
            self._gen += 1
            self._cond.notify_all()
