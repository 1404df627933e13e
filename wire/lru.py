"""A bounded, ordered dict: the caches and the "recently ended" memories every part keeps."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

__all__ = ["LRU"]

K = TypeVar("K")
V = TypeVar("V")


class LRU(OrderedDict[K, V]):
    """Keeps at most ``limit`` entries; setting an entry makes it the newest, and the oldest
    goes when the limit is passed. ``touch`` reads an entry and makes it the newest."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.limit:
            self.popitem(last=False)

    def touch(self, key: K) -> V | None:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value
