"""The broker's mirror of a worker's program cache counts each program no smaller than the
worker does, whoever's copy went last (w31-sec, item 3).

The mirror is keyed by (driver, digest); the worker caches by digest. A junk copy under a
digest (driver b's, say, of a digest the worker holds a genuine copy of) was charged its
own small size, while b's jobs keep the worker's large genuine entry fresh: the mirror's
count fell below the worker's, and only the worker's larger byte budget kept the mirror
from believing the worker held a program it had dropped. These tests give both the same
budget: then a key the mirror believes held must be held.
"""

from __future__ import annotations

import random
from functools import partial

import pytest
from test_bounds import _program, drivers_copies

from mpl.broker import registry
from mpl.broker.registry import WorkerEntry
from mpl.wire.control import WorkerHello
from mpl.wire.jobs import Program, program_nbytes
from mpl.worker import state as worker_state
from mpl.worker.state import WorkerState

BUDGET = 40_000


def _pair(monkeypatch: pytest.MonkeyPatch) -> tuple[WorkerEntry, WorkerState]:
    monkeypatch.setattr(registry, "PROGRAM_MIRROR_BYTES", BUDGET)
    monkeypatch.setattr(worker_state, "WORKER_PROGRAM_BYTES", BUDGET)  # no room to spare
    hello = WorkerHello(1, "i", 1, "h", "tcp://d", "")
    mirror = WorkerEntry(1, b"w1", hello, 0.0, 0.0)
    return mirror, WorkerState(hello, now=0.0, heartbeat_s=1.0)


def _job(mirror: WorkerEntry, worker: WorkerState, driver: str, copy: Program) -> bool:
    """A job of ``driver`` running ``copy``'s digest, as broker and worker see it: the
    program first if the mirror says so, then the job's look-up. Whether it found it."""
    if mirror.needs_program((driver, copy.digest), partial(program_nbytes, copy, 1)):
        worker.handle(copy, 0.0)
    return worker.program(copy.digest) is not None


def _believed_held(mirror: WorkerEntry, worker: WorkerState, junk_of: set[str]) -> None:
    for (owner, digest), _ in mirror.programs.items():
        if owner == "b" and digest in junk_of:
            continue  # b sent only junk of it: its jobs fail however the mirror counts
        assert digest in worker.programs, f"the mirror believes {owner}'s {digest} is held"


def test_a_junk_copy_keeping_a_large_program_fresh_is_charged_that_programs_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror, worker = _pair(monkeypatch)
    big = _program(12_000, 1)
    junk = Program(big.digest, _program(100, 2).graph)  # b's copy: another, small graph
    assert _job(mirror, worker, "a", big)
    assert _job(mirror, worker, "b", junk)  # refused, but the job finds a's genuine copy
    others = [_program(5_000, 10 + n) for n in range(12)]
    for other in others:  # a's other work, while b keeps the big program fresh
        assert _job(mirror, worker, "a", other), "a's program was not sent again"
        assert _job(mirror, worker, "b", junk)
        _believed_held(mirror, worker, {big.digest})
    for other in others:
        if ("a", other.digest) in mirror.programs:
            assert _job(mirror, worker, "a", other)


def test_a_larger_copy_arriving_later_raises_the_charge_of_the_keys_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror, worker = _pair(monkeypatch)
    big = _program(12_000, 1)
    junk = Program(big.digest, _program(100, 2).graph)
    assert not _job(mirror, worker, "b", junk)  # junk first: nothing held
    assert _job(mirror, worker, "a", big)
    assert _job(mirror, worker, "b", junk)  # b's key, charged small, is the newest now
    for n in range(20):
        other = _program(5_000, 10 + n)
        assert _job(mirror, worker, "a", other)
        assert _job(mirror, worker, "b", junk)
        _believed_held(mirror, worker, {big.digest})
    assert mirror.programs.nbytes <= BUDGET


def _orphaned(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[WorkerEntry, WorkerState, list[Program], list[Program]]:
    """A mirror and a worker with twice its room (as deployed) after ``a``'s five large
    programs were pushed out of the mirror's keys by smaller ones: (mirror, worker, the
    large programs, those the worker still holds)."""
    mirror, worker = _pair(monkeypatch)
    monkeypatch.setattr(worker_state, "WORKER_PROGRAM_BYTES", 2 * BUDGET)
    worker = WorkerState(WorkerHello(1, "i", 1, "h", "tcp://d", ""), now=0.0, heartbeat_s=1.0)
    bigs = [_program(12_000, n) for n in range(5)]
    for big in bigs:
        assert _job(mirror, worker, "a", big)
    n = 10
    while any(("a", big.digest) in mirror.programs for big in bigs):
        assert _job(mirror, worker, "a", _program(3_000, n))
        n += 1
    return mirror, worker, bigs, [big for big in bigs if big.digest in worker.programs]


def test_entries_the_mirror_forgot_and_junk_copies_revived_are_charged_their_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker, with twice the mirror's room as deployed, holds programs after the
    mirror dropped every key of theirs. Junk copies of those digests make them the worker's
    newest entries again: the mirror remembers the largest copy it sent under each digest,
    and with junk charged its own size the revived programs outgrew the worker's spare room."""
    mirror, worker, bigs, orphans = _orphaned(monkeypatch)
    junk = _program(100, 99).graph
    assert len(orphans) >= 3  # held on, unknown to the mirror's keys
    for m in range(30):
        for big in orphans:  # revived, and kept fresh
            _job(mirror, worker, "b", Program(big.digest, junk))
        assert _job(mirror, worker, "a", _program(3_000, 100 + m))
        _believed_held(mirror, worker, {big.digest for big in bigs})


def test_a_flood_of_junk_digests_does_not_make_the_mirror_forget_a_held_programs_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, but b first sends junk under more digests than the mirror remembers
    exactly (REMEMBERED_DIGESTS; the worker holds none of them, so they push nothing out
    of its cache): what it remembers past them may overstate a size, never understate it."""
    mirror, worker, bigs, orphans = _orphaned(monkeypatch)
    junk = _program(100, 99).graph
    assert len(orphans) >= 3
    flood = [f"{m:032x}" for m in range(registry.REMEMBERED_DIGESTS + 10)]
    for digest in flood:  # junk alone, under new digests
        assert not _job(mirror, worker, "b", Program(digest, junk))
    assert all(big.digest in worker.programs for big in orphans)  # none pushed out
    for m in range(30):
        for big in orphans:
            _job(mirror, worker, "b", Program(big.digest, junk))
        assert _job(mirror, worker, "a", _program(3_000, 100 + m))
        _believed_held(mirror, worker, {big.digest for big in bigs} | set(flood))


def test_random_drivers_and_junk_with_equal_budgets_never_fool_the_mirror(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror, worker = _pair(monkeypatch)
    rng = random.Random(31)
    made = [_program(rng.randrange(200, 9_000), step) for step in range(40)]
    junk = _program(150, 999).graph
    fooled = 0
    for driver, copy, genuine in drivers_copies(rng, made, junk, 3_000):
        found = _job(mirror, worker, driver, copy)
        fooled += genuine and not found
    assert fooled == 0, f"{fooled} genuine jobs found no program the mirror believed held"
    assert mirror.programs.dropped > 0 and mirror.programs.nbytes <= BUDGET
