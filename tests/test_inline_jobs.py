"""Quick local jobs run without a hand-off to the job pool (worker/jobs.py):
which jobs qualify, that a slow run sends a program back to the pool, and that arrival
order within a session holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from helpers import nap_then_thread, thread_name, wait_until

import mpl.driver as mp
from mpl.driver.launcher import ProcessCluster
from mpl.worker.cli import main as worker_main

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


def test_the_inline_threshold_can_be_pinned_on_the_command_line(tmp_path: Path) -> None:
    """``mpl-worker --inline-ms`` (hidden: a profiler pins it, so that the jobs valgrind
    slows down stay on the inline path): 0 sends every job to the pool, a high one keeps
    a quick program inline after its first run."""
    spec = mp.ClusterSpec.simple(2, enable_spu=False)
    pins = {0: ["--inline-ms", "0"], 1: ["--inline-ms", "10000"]}
    procs = ProcessCluster(spec, run_dir=tmp_path / "run", worker_args=pins)
    try:
        with mp.connect(procs.address) as ctx:
            names = {
                p: [mp.fetch(mp.device(p)(thread_name)()) for _ in range(4)] for p in ("P0", "P1")
            }
            ctx.close()
    finally:
        procs.close()
    assert all(name.startswith("mpl-job") for name in names["P0"])
    assert names["P1"][0].startswith("mpl-job")  # first run: on the pool, measured
    assert names["P1"][1:] == ["MainThread"] * 3  # mpl-worker's I/O thread


@pytest.mark.parametrize("pin", ["nan", "inf", "-1", "3600001"])
def test_an_inline_threshold_that_is_no_duration_is_refused(pin: str) -> None:
    """``--inline-ms`` must be a duration: NaN compares false with every run's time (no
    run would ever go inline, silently), infinity would keep a program inline however long
    it ran; both are refused when the command line is read, as are a negative one and one
    above an hour. Only parsed here (no worker starts, whatever the outcome)."""
    args = ["--broker", "tcp://127.0.0.1:1", "--rank", "0", "--inline-ms", pin]
    with pytest.raises(click.BadParameter) as refused:
        worker_main.make_context("mpl-worker", args)
    assert "--inline-ms" in refused.value.format_message() + str(refused.value.param_hint)


def _boom() -> None:
    raise ValueError("boom")


def test_a_one_call_program_fails_inline_as_it_fails_on_the_pool(sim: mp.Simulator) -> None:
    """A program of one call made by the job shell itself (``InlineRun.call``) fails as its
    run on the pool does: the same error kind, op, rank, type and message."""
    job = mp.function(lambda: mp.simp.pcall((1,), _boom))
    seen = []
    for _ in range(3):  # the first run on the pool, the next ones inline
        with pytest.raises(mp.RemoteError) as failed:
            mp.fetch(job())
        err = failed.value
        seen.append((type(err), err.op, err.rank, err.remote_type, err.remote_message))
    assert _inline(sim, 1) == 2
    # inline, a call the job shell made itself
    compiled = [c for c in sim.runtime.workers[1].jobs._compiled.values() if c is not None]
    assert len(compiled) == 1 and getattr(compiled[0].call, "__name__", "") == "_boom"
    assert seen[0] == seen[1] == seen[2]
    assert seen[0][2:4] == (1, "ValueError") and "boom" in seen[0][4]
