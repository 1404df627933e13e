"""Bounds on worker tables fed by peers: the SPU mailbox, in entries and in bytes."""

from __future__ import annotations

import time

from mpl.worker.spu_link import SpuMailbox

LANE = "s/SP0/t/0"


def test_the_spu_mailbox_is_bounded_in_entries_and_counts_what_it_drops() -> None:
    box = SpuMailbox(max_entries=4, max_bytes=1 << 20)
    box.open_lane(LANE)
    for i in range(10):  # a member floods a real lane with distinct keys
        box.put(LANE, 1, f"k{i}", b"x")
    assert box.pending() == (4, 4) and box.overflow == 6
    deadline = time.monotonic() + 1
    assert box.get(LANE, 1, "k0", ("s", "j"), deadline) == b"x"  # a receive makes room
    box.put(LANE, 1, "k4", b"y")
    assert box.pending() == (4, 4) and box.overflow == 6


def test_the_spu_mailbox_is_bounded_in_bytes_and_frees_them_with_the_lane() -> None:
    box = SpuMailbox(max_entries=1000, max_bytes=100)
    box.open_lane(LANE)
    box.put(LANE, 1, "a", b"x" * 60)
    box.put(LANE, 1, "b", b"x" * 60)  # 120 bytes would pass the bound: dropped
    assert box.pending() == (1, 60) and box.overflow == 1
    box.drop_lane(LANE)
    assert box.pending() == (0, 0)
    other = "s2/SP0/t/0"
    box.open_lane(other)
    box.put(other, 1, "a", b"x" * 90)
    assert box.pending() == (1, 90)
    box.close_session("s2", "closed")
    assert box.pending() == (0, 0)
