"""What a worker's I/O thread runs per repeat trivial job, whole: counted, not timed.

With many workers on 2 cores, a fan-out job costs about the sum of every worker's CPU per
job, and a worker's is mostly the Python its I/O thread runs for the job, on cold caches.
``test_worker_calls.py`` counts the worker's own functions inside the handling of an
``Exec``; this counts everything the I/O thread calls while it takes one turn of its loop
for a job (``Worker._turn``: the receive, the handling, the Done sent, the clock read),
Python functions and builtins alike (``sys.setprofile``'s ``call`` and ``c_call``), so a
cut anywhere on that path, or a call added to it, shows up here whatever the machine's
speed. The job is the trivial one of the fan-out benchmark: an ``@mp.function`` pcall on
every rank returning 1, then a fetch, in plaintext, on its inline path.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

import mpl.driver as mp
from mpl.worker.daemon import Worker

_JOBS = 60
_GENEROUS_S = 10.0  # the inline threshold: no run on a busy machine may count as slow
# 209cfaa: 15 Python calls and 39 builtin calls per job's turn (the user's function among
# them). A compiled run's one scalar output stored without _store_outputs' call: 14 (and
# 39 builtins: a memoryview's tobytes less, an env.get its map made unseen more). A
# plaintext one-op run's Done joined from a template (OneSpanDone.frame for pack_stats and
# own_done_fields, and its one-frame send for the frames' send): 13 (still 39 builtins: a
# struct pack, a join and an encode for the two msgpack packs, which compiled methods are
# not counted here). Half a call of margin, so that a stray call does not fail it; 371bb90
# fails the first. Then a message of one small frame was read by the compiled Frame's own
# descriptors and a program's next Exec recognised in it as received (no list of frames,
# no two slices: 37 builtins), and a program of one call without arguments made that call
# in the job shell, its value stored as it is (no compiled run's loop, no list of
# outputs): 12 and 34 (2357d5f counts 13 and 39). Then a program's next job took the
# graph the state found for the last one while no program was put or looked up since (no
# program cache lookup, its call and its two builtins), and an empty table of aborted jobs
# was not asked to pop the job that ended: 11 and 31 (6010789 counts 12 and 34). Then the
# plaintext repeat's common case was one call of the job shell (Jobs.run_repeat, for
# _on_repeat, run_now, _run_compiled), its Done sent by the turn (no _post_done_frame, its
# thread check): 8 and 29 (9d6a58f counts 11 and 31).
_MAX_PYTHON_CALLS = 8.5
# Left out: the receive timeout's reset (pyzmq's option lookup, in enum.py), which comes
# as often as the clock says (every 5 ms of turns), not once per job.
_CLOCKED = "enum.py"
_MAX_BUILTIN_CALLS = 29.5


@pytest.fixture
def sim() -> Iterator[mp.Simulator]:
    ctx = mp.Simulator.simple(2)
    with ctx:
        yield ctx
    ctx.close()


def _job_turns(worker: Worker, run: Any, jobs: int) -> list[Counter[str]]:
    """Run ``run()`` ``jobs`` times; the calls ``worker``'s I/O thread made in each turn of
    its loop that ran a job inline and did not run the timers (those run every 100 ms at
    most, at whatever job they fall on; the broker's heartbeats take turns of their own)
    nor wake from a rest, by ``kind name``."""
    turns: list[Counter[str]] = []
    real = worker._turn

    def turn(next_timers: float) -> float:
        calls: Counter[str] = Counter()

        def count(frame: FrameType, event: str, arg: Any) -> None:
            where = frame.f_code.co_filename.rsplit("/", 1)[-1]
            if where == _CLOCKED:
                return
            if event == "call":
                calls[f"py {where}:{frame.f_code.co_name}"] += 1
            elif event == "c_call":
                calls[f"c {getattr(arg, '__qualname__', '?')}"] += 1

        sys.setprofile(count)
        try:
            return real(next_timers)
        finally:
            sys.setprofile(None)
            calls["c setprofile"] -= 1  # the counter's own way out
            turns.append(calls)

    worker._turn = turn  # type: ignore[method-assign]  # the I/O thread's next turn, counted
    try:
        for _ in range(jobs):
            run()
    finally:
        worker._turn = real  # type: ignore[method-assign]  # put back
    ran = [t for t in turns if t["py inline_jobs.py:run_repeat"]]
    # nor the turns of a worker that had gone to rest (a wait timed out: a slow machine)
    return [t for t in ran if not t["py jobs.py:report_progress"] and not t["py daemon.py:_rest"]]


def _per_job(turns: list[Counter[str]], kind: str) -> float:
    return sum(n for t in turns for name, n in t.items() if name.startswith(kind)) / len(turns)


def test_a_repeat_trivial_job_costs_the_io_thread_few_calls(sim: mp.Simulator) -> None:
    worker = sim.runtime.workers[1]
    worker.jobs.inline_s = _GENEROUS_S
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):  # the first run is on the pool, measured; then it is quick
        assert mp.fetch(job()) == [1, 1]
    inline = int(worker.jobs.stats()["jobs_inline"])
    turns = _job_turns(worker, lambda: mp.fetch(job()), _JOBS)
    assert int(worker.jobs.stats()["jobs_inline"]) - inline == _JOBS  # all on the inline path
    # one turn per job (its Exec), but for the few that also ran the timers (how many
    # depends on the machine's speed: most, whatever it is)
    assert _JOBS // 2 <= len(turns) <= _JOBS
    # its Exec recognised in the frame as received (not cut in two for _on_frames), its one
    # call made by the job shell (no compiled run's loop)
    assert all(
        t["py exec_repeat.py:repeat_frame"] == t["py inline_jobs.py:run_repeat"] == 1
        and t["py broker_messages.py:_on_frames"] == t["py inline_run.py:run"] == 0
        and t["py broker_messages.py:_on_repeat"] == t["py inline_jobs.py:run_now"] == 0
        for t in turns
    )
    python, builtin = _per_job(turns, "py "), _per_job(turns, "c ")
    every = sorted(sum(turns, Counter()).items())
    assert python <= _MAX_PYTHON_CALLS, f"{python:.2f} Python calls per job: {every}"
    assert builtin <= _MAX_BUILTIN_CALLS, f"{builtin:.2f} builtin calls per job: {every}"
