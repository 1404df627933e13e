"""How much Python a worker runs per repeat quick job: counted, not timed.

With many workers on few cores, a fan-out job costs about the sum of every worker's CPU per
job, and most of that is Python run on cold caches: every function call the I/O thread
makes per job counts. These tests count the worker's own calls (``mpl.worker`` and the Done
packing) while it handles one ``Exec`` of a quick job it has run before, so a change that
adds calls to that path shows up here, whatever the machine's speed."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

import mpl.driver as mp
from mpl.wire.hot import read_exec

_JOBS = 40
_GENEROUS_S = 10.0
# 32 calls before the hot path was trimmed (a stop check the state had just made, the
# per-op progress report call, comprehensions and walks over plain outputs, a check of
# refused sessions when there are none, ...), 17 after (with the kernel and the store's
# put counted); then the Done went out before the state's end-of-job bookkeeping (its stop
# check a call of its own, +1) and a run's timing wrapper was folded into the run (-1): 17.
# Then a repeat Exec went straight to its handling (no batch check, no general message
# path: -2, +1 for the Exec's own handler), the job's progress position became an
# attribute (-1), an inline run answered with its Done alone and booked its end and sent it
# without a second call each (-2): 13.
_MAX_CALLS_PER_JOB = 13


@pytest.fixture
def sim() -> Iterator[mp.Simulator]:
    ctx = mp.Simulator.simple(2)
    with ctx:
        yield ctx
    ctx.close()


def _worker_calls(sim: mp.Simulator, rank: int, job: Any) -> tuple[int, Counter[str]]:
    """Run ``job`` _JOBS times; the worker-side Python calls made while ``rank``'s I/O thread
    handled the jobs' Execs, and which functions."""
    worker = sim.runtime.workers[rank]
    calls: Counter[str] = Counter()
    handled = [0]

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename.replace("\\", "/")
            if "/mpl/worker/" in path or path.endswith("/done_pack.py"):
                calls[f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1

    handle = worker._on_frames

    def counted(frames: list[Any]) -> None:
        if read_exec(frames) is None:  # a heartbeat, a directory: not the job's
            handle(frames)
            return
        handled[0] += 1
        sys.setprofile(count)
        try:
            handle(frames)
        finally:
            sys.setprofile(None)

    worker._on_frames = counted
    try:
        for _ in range(_JOBS):
            assert mp.fetch(job()) == [1, 1]
    finally:
        worker._on_frames = handle
    assert handled[0] == _JOBS, "one Exec per job expected"
    return sum(calls.values()), calls


def test_a_repeat_quick_job_costs_the_worker_few_python_calls(sim: mp.Simulator) -> None:
    # the test counts calls, not time: no run on a busy machine may count as slow
    sim.runtime.workers[1].jobs.inline_s = _GENEROUS_S
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):  # the first run is on the pool, measured; then it is quick
        mp.fetch(job())
    inline_before = int(sim.runtime.workers[1].jobs.stats()["jobs_inline"])
    repeats_before = sim.runtime.workers[1]._execs.repeats
    total, calls = _worker_calls(sim, 1, job)
    assert int(sim.runtime.workers[1].jobs.stats()["jobs_inline"]) - inline_before == _JOBS
    # each Exec read by comparison with the one before (mpl.wire.exec_repeat), not in full
    assert sim.runtime.workers[1]._execs.repeats - repeats_before == _JOBS
    per_job = total / _JOBS
    assert per_job <= _MAX_CALLS_PER_JOB, (
        f"{per_job:.1f} worker calls per job: {sorted(calls.items())}"
    )
    # a program's next Exec is recognised first and handled at once: not checked for a
    # batch, nor taken through the general message path
    assert calls["daemon.py:_on_message"] == 0 and calls["daemon.py:_on_broker"] == 0
    assert calls["daemon.py:_on_exec"] == _JOBS
    # the state decided under its lock that the job may run: no second stop check
    assert calls["jobs.py:stopped"] == 0 and calls["state.py:stopped"] == 0
