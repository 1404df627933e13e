"""Quick local jobs run without a hand-off to the job pool (worker/jobs.py):
which jobs qualify, that a slow run sends a program back to the pool, and that arrival
order within a session holds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import nap_then_thread, thread_name, wait_until

import mpl.driver as mp

_GENEROUS_S = 10.0  # the tests decide by behaviour, not by how fast this machine is today


@pytest.fixture
def sim() -> Iterator[mp.Simulator]:
    ctx = mp.Simulator.simple(2)
    for worker in ctx.runtime.workers:
        worker.jobs.inline_s = _GENEROUS_S
    with ctx:
        yield ctx
    ctx.close()


def _inline(sim: mp.Simulator, rank: int) -> int:
    return int(sim.runtime.workers[rank].jobs.stats()["jobs_inline"])


def test_a_quick_local_program_runs_on_the_io_thread_after_its_first_run(
    sim: mp.Simulator,
) -> None:
    where = mp.device("P0")(thread_name)
    names = [mp.fetch(where()) for _ in range(4)]
    assert names[0].startswith("mpl-job")  # first run: on the pool, measured
    assert names[1:] == ["mpl-worker-0"] * 3  # then the thread that received the job
    assert _inline(sim, 0) == 3
    assert _inline(sim, 1) == 0


def test_a_slow_run_sends_the_program_back_to_the_pool(sim: mp.Simulator) -> None:
    where = mp.device("P0")(thread_name)
    assert mp.fetch(where()).startswith("mpl-job")
    assert mp.fetch(where()) == "mpl-worker-0"
    # the worker books a run after its answer went out: the new limit must not reach that run
    jobs = sim.runtime.workers[0].jobs
    wait_until(lambda: jobs.stats()["jobs_done"] >= 2, what="the second run booked")
    jobs.inline_s = 1e-12  # every run is now too slow to stay inline
    assert mp.fetch(where()) == "mpl-worker-0"  # it was quick last time: inline, measured
    wait_until(lambda: jobs.stats()["jobs_done"] >= 3, what="the third run booked")
    assert mp.fetch(where()).startswith("mpl-job")
    assert mp.fetch(where()).startswith("mpl-job")
    assert _inline(sim, 0) == 2


def test_programs_that_move_values_never_run_inline(sim: mp.Simulator) -> None:
    @mp.function
    def hop(x: mp.Value) -> mp.Value:
        return mp.put("P1", x)

    x = mp.device("P0")(lambda: 3)()
    for _ in range(4):
        assert mp.fetch(hop(x)) == 3
    assert _inline(sim, 0) == 0
    assert _inline(sim, 1) == 0


def test_a_job_behind_queued_work_of_its_session_waits_its_turn(sim: mp.Simulator) -> None:
    where = mp.device("P0")(thread_name)
    slow = mp.device("P0")(nap_then_thread)
    mp.fetch(where())
    assert mp.fetch(where()) == "mpl-worker-0"
    inline = _inline(sim, 0)
    first = mp.submit(slow, 0.3)
    second = mp.submit(where)
    # the quick job arrives while the slow one runs: it queues behind it, in order
    assert mp.fetch(second.result(timeout=30)).startswith("mpl-job")
    assert first.done()
    assert mp.fetch(first.result()).startswith("mpl-job")
    assert _inline(sim, 0) == inline
