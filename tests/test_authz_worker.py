"""A worker accepts peer traffic only for work it knows of; the rest waits, bounded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import wait_until

from mpl.wire.control import WorkerHello
from mpl.wire.sessions import DeleteSymbol
from mpl.worker.holding import Holding
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import move_mailbox, spu_mailbox
from mpl.worker.state import WorkerState
from mpl.worker.store import ObjectStore, SymbolDisk


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_moves_for_unknown_jobs_are_held_within_bounds_and_counted() -> None:
    box = move_mailbox(Holding(max_entries=4, max_bytes=1 << 20))
    for i in range(10):  # forged: jobs that will never run here
        box.put(("s", f"guess{i}", 0, 0, 1, ""), np.zeros(8))
    assert box.held() == 4 and box.held_dropped == 6 and box.pending() == (0, 0)
    big = np.zeros(1 << 18)  # 2 MiB: over the byte bound alone
    box2 = move_mailbox(Holding(max_entries=100, max_bytes=1 << 20))
    assert not box2.put(("s", "j", 0, 0, 1, ""), big) and box2.held_dropped == 1


def test_genuine_moves_are_never_refused_for_lack_of_room() -> None:
    box = move_mailbox(Holding(max_entries=2, max_bytes=1 << 20))
    for i in range(5):
        box.put(("s", f"forged{i}", 0, 0, 1, ""), b"x")
    box.open(("s", "real"))
    for op in range(50):
        assert box.put(("s", "real", op, 0, 1, ""), np.ones(4))
    assert box.take(("s", "real", 49, 0, 1, ""), time.monotonic() + 1, "").tolist() == [1.0] * 4
    assert box.held() == 2


def test_a_move_that_overtook_its_exec_is_handed_over() -> None:
    box = move_mailbox(Holding(max_entries=8))
    assert box.put(("s", "j", 3, 0, 1, ""), "early")
    assert not box.put(("s", "j", 3, 0, 1, ""), "dup")
    assert box.pending()[0] == 0 and box.held() == 1
    box.open(("s", "j"))
    assert box.pending()[0] == 1 and box.held() == 0
    assert box.take(("s", "j", 3, 0, 1, ""), time.monotonic() + 1, "") == "early"
    box.put(("s", "k", 1, 0, 1, ""), "also early")  # a waiting job thread also adopts
    assert box.take(("s", "k", 1, 0, 1, ""), time.monotonic() + 1, "") == "also early"


def test_held_moves_expire_and_closed_sessions_drop_theirs() -> None:
    clock = Clock()
    box = move_mailbox(Holding(max_entries=8, hold_s=5.0, clock=clock))
    box.put(("s", "old", 0, 0, 1, ""), "a")
    clock.now = 6.0
    box.put(("s", "new", 0, 0, 1, ""), "b")  # arriving traffic sweeps out the old
    assert box.held() == 1 and box.held_dropped == 1
    box.close_where(lambda job: job[0] == "s", "closed")
    assert box.held() == 0


def test_spu_messages_for_unknown_lanes_are_held_bounded_then_handed_over() -> None:
    box = spu_mailbox(Holding(max_entries=3))
    for i in range(6):
        box.put((f"s/SP0/forged/{i}", 1, "k"), b"x")
    assert box.held_dropped == 3
    box.put(("s/SP0/real/0", 1, "k"), b"early")  # no room: a lane nobody opened
    box.open("s/SP0/real/0")
    box.put(("s/SP0/real/0", 1, "k"), b"first")
    box.put(("s/SP0/real/0", 1, "k"), b"second")
    deadline = time.monotonic() + 1
    assert box.take(("s/SP0/real/0", 1, "k"), deadline, "") == b"first"
    assert box.take(("s/SP0/real/0", 1, "k"), deadline, "") == b"second"
    lane = spu_mailbox(Holding(max_entries=3))
    lane.put(("s/SP0/t/0", 1, "a"), b"1")
    lane.put(("s/SP0/t/0", 1, "a"), b"2")
    lane.open("s/SP0/t/0")
    assert lane.take(("s/SP0/t/0", 1, "a"), deadline, "") == b"1"
    assert lane.take(("s/SP0/t/0", 1, "a"), deadline, "") == b"2"


def test_a_symbol_name_never_reaches_outside_the_data_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "secret.value"
    outside.write_bytes(b"not yours")
    (tmp_path / "secret.info").write_bytes(b"")
    store = ObjectStore(SymbolDisk(root))
    with pytest.raises(ValueError, match="bad value name"):
        store.get("s", "sym:../../secret")
    posted: list[Any] = []
    state = WorkerState(WorkerHello(0, "i", 1, "h", "tcp://d", ""), now=0.0)
    jobs = Jobs(state, store, move_mailbox(), None, posted.append)  # type: ignore[arg-type]
    jobs.handle(DeleteSymbol("s", 7, "../../secret", (0,), True))
    wait_until(lambda: posted, what="the ack")
    assert posted[0].error is not None and outside.exists()
