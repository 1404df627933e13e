"""The bounded cache every part keeps."""

from __future__ import annotations

from mpl.wire.lru import LRU


def test_oldest_entry_goes_and_touch_keeps_one_alive() -> None:
    cache: LRU[str, int] = LRU(2)
    cache["a"] = 1
    cache["b"] = 2
    assert cache.touch("a") == 1  # a is now the newest
    cache["c"] = 3
    assert list(cache) == ["a", "c"]
    assert cache.touch("b") is None
    cache["a"] = 4  # setting again makes it the newest too
    cache["d"] = 5
    assert list(cache.items()) == [("a", 4), ("d", 5)]
