"""Bounded, ordered dicts: the caches and the "recently ended" memories every part keeps."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["LRU", "SizedLRU"]

K = TypeVar("K")
V = TypeVar("V")


class LRU(OrderedDict[K, V]):
    """Keeps at most ``limit`` entries; setting an entry makes it the newest, and the oldest
    goes when the limit is passed. ``touch`` reads an entry and makes it the newest."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.dropped = 0  # entries pushed out by newer ones, for status

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.limit:
            self.popitem(last=False)
            self.dropped += 1

    def touch(self, key: K) -> V | None:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value


class SizedLRU(Generic[K, V]):
    """An LRU bounded in entries AND in bytes (each entry's size is given when it is put).

    An entry larger than the whole budget is not kept at all. ``dropped`` counts entries
    that were evicted or refused, for status. Not thread-safe: callers hold their own lock.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.dropped = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def put(self, key: K, value: V, size: int) -> bool:
        """Keep ``value`` as the newest entry; False if it is too large to keep."""
        self.pop(key)
        if size > self.max_bytes:
            self.dropped += 1
            return False
        self._items[key] = (value, size)
        self.nbytes += size
        while len(self._items) > self.max_entries or self.nbytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.nbytes -= old
            self.dropped += 1
        return True

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def pop(self, key: K) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.nbytes -= item[1]
        return item[0]

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a copy: for listings)."""
        return [(key, value) for key, (value, _) in self._items.items()]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
