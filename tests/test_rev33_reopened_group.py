"""Review w32 B3: a job's move group pushed out of the mailbox's memory of open groups
and reopened by the thread waiting in it accepted any key.

A worker remembers at most 4,096 open move groups (``worker/keyed_mailbox.py``); a
driver queueing that many jobs behind a running one pushes the running job's group out.
Its moves then wait in the holding area, and the job's thread, asking for its next move,
opened the group again without the program's slots: every move a co-party parked for it,
under any op number, was kept until the job ended (R32-3 again). Now the waiting thread
reopens it with exactly the slots its program takes.

The attack: rank 2's own node key on a raw CURVE PUSH into a real peer intake, and the
job's real receive (``worker/job_run.JobRun.recv``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
from helpers import wait_until
from test_red32_peer_flood import _OTHER, _SHARED, _Rank0, _takes

from mpl.wire.data import Move
from mpl.worker.job_run import JobRun
from mpl.worker.keyed_mailbox import _MEMORY


@pytest.fixture
def rank0(zmq_ctx: zmq.Context[Any]) -> Iterator[_Rank0]:
    r = _Rank0(zmq_ctx)
    try:
        yield r
    finally:
        r.close()


def _job_run(rank0: _Rank0, job: str) -> JobRun:
    """The running job's context at rank 0, as the worker's job thread makes it."""
    jobs = SimpleNamespace(rank=0, store=None, sealers=None, mailbox=rank0.mailbox)
    now = time.monotonic()
    return JobRun(jobs, "s", job, now + 30, now, _SHARED)  # type: ignore[arg-type]


def test_a_group_reopened_by_its_waiting_thread_keeps_only_its_programs_slots(
    rank0: _Rank0,
) -> None:
    box = rank0.mailbox
    box.open(("s", "running"), _takes(_SHARED, 0))  # its Expect: op 1, seq 0, from rank 2
    for i in range(_MEMORY):  # the driver's queued jobs, each opened by its Expect
        box.open(("s", f"queued{i}"), _takes(_OTHER, 0))
    parked = 40
    for op in range(1000, 1000 + parked):  # ops the program never reads
        rank0.send(2, Move("s", "running", op, 0, 2, 0, b"x" * 64))
    rank0.send(2, Move("s", "running", 1, 0, 2, 0, b"genuine"))
    wait_until(lambda: box.held() + box.dropped >= parked + 1, 30, "the moves to arrive")
    assert _job_run(rank0, "running").recv(2, 1, 0) == b"genuine"
    for op in range(2000, 2000 + parked):  # and sent after the group is open again
        rank0.send(2, Move("s", "running", op, 0, 2, 0, b"x" * 64))
    wait_until(lambda: box.pending()[0] + box.dropped >= 2 * parked, 30, "the second lot")
    assert box.pending()[0] == 0, f"{box.pending()[0]} moves the program never reads kept"
    assert box.unexpected == 2 * parked  # both lots, refused as the program's own group
    assert rank0.intake.errors == parked  # the second lot, each charged to rank 2 at once


def test_a_reopened_group_still_takes_its_genuine_moves(rank0: _Rank0) -> None:
    """The fix does not refuse what the program reads: a genuine move arriving after the
    reopen is taken."""
    box = rank0.mailbox
    box.open(("s", "running"), _takes(_SHARED, 0))
    for i in range(_MEMORY):
        box.open(("s", f"queued{i}"), _takes(_OTHER, 0))
    run = _job_run(rank0, "running")
    rank0.send(2, Move("s", "running", 1, 0, 2, 0, b"late but genuine"))
    assert run.recv(2, 1, 0) == b"late but genuine"
    assert (box.unexpected, box.overflow) == (0, 0)


def test_a_group_pushed_out_while_its_thread_waits_is_reopened_with_its_slots(
    rank0: _Rank0,
) -> None:
    """The thread opens its group again at each wake, not only when it starts waiting:
    pushed out a second time meanwhile, its genuine move (held) still reaches it, and
    a co-party's junk is still refused."""
    import threading

    box = rank0.mailbox
    box.open(("s", "running"), _takes(_SHARED, 0))
    run = _job_run(rank0, "running")
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(run.recv(2, 1, 0)))
    waiter.start()
    try:
        for i in range(_MEMORY):  # pushed out while the thread waits
            box.open(("s", f"queued{i}"), _takes(_OTHER, 0))
        for op in range(1000, 1010):
            rank0.send(2, Move("s", "running", op, 0, 2, 0, b"junk"))
        rank0.send(2, Move("s", "running", 1, 0, 2, 0, b"genuine"))
        waiter.join(30)
    finally:
        box.close(("s", "running"), "test over")
        waiter.join(5)
    assert got == [b"genuine"]
    wait_until(lambda: box.pending()[0] + box.dropped >= 10, 30, "the junk to arrive")
    assert box.pending()[0] == 0
