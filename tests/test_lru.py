"""The bounded cache every part keeps."""

from __future__ import annotations

from mpl.wire.lru import LRU, SizedLRU


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


def test_sized_lru_is_bounded_in_bytes_and_counts_what_it_drops() -> None:
    cache: SizedLRU[str, str] = SizedLRU(max_entries=10, max_bytes=100)
    assert cache.put("a", "x", 60) and cache.put("b", "y", 30)
    assert cache.get("a") == "x"  # a is now the newest
    assert cache.put("c", "z", 30)  # 120 bytes: the oldest (b) goes
    assert "b" not in cache and cache.nbytes == 90 and cache.dropped == 1
    assert not cache.put("huge", "w", 101)  # never kept, even alone
    assert len(cache) == 2 and cache.dropped == 2
    assert cache.pop("a") == "x" and cache.nbytes == 30
