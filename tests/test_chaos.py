"""Chaos: a stream of jobs (moves, SPU ops, persisted saves) across 3 real workers while a
seeded schedule ``kill -9``s and restarts workers and the broker.

Every job must end, within its bound, with the right value or a typed error (an
``MplError``); none may hang. Afterwards every value whose save succeeded loads back whole,
a save that failed either loads whole or not at all, and a new session runs a move and an
SPU op. The seed is printed on failure; set ``MPL_CHAOS_SEED`` to replay one schedule.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpl.driver as mp
from mpl.wire import ClusterSpec
from mpl.wire.codec import pickle_by_value
from mpl.wire.errors import MplError

# the schedule (about 60 s) and, on a loaded machine, cold jobs before and after it
pytestmark = [pytest.mark.daemons, pytest.mark.spu, pytest.mark.chaos, pytest.mark.timeout(300)]
pickle_by_value(sys.modules[__name__])  # workers do not have the tests: ship these functions

SEED = int(os.environ.get("MPL_CHAOS_SEED", "20261130"))
CHAOS_S = 50.0  # how long the schedule runs
JOB_TIMEOUT_S = 8.0  # each job's and each request's deadline
# A unit makes at most 4 round trips, each bounded by its deadline plus the driver's grace.
UNIT_BOUND_S = 4 * (JOB_TIMEOUT_S + 1.5)
# The deadline of a job that may find its workers cold, outside the schedule: the warm-up,
# and the checks after it (a worker restarted late in the schedule). Each worker imports
# jax and spu on its first SPU op (a few CPU-seconds each) and compiles: on a loaded
# 2-core machine that honestly takes longer than JOB_TIMEOUT_S. It is also the workers'
# ``--job-timeout``, the most a job may ask for; the schedule's jobs ask JOB_TIMEOUT_S.
COLD_JOB_TIMEOUT_S = 60.0


def make_block(seed: int) -> np.ndarray:
    return np.arange(256, dtype=np.float64) * seed


def total(x: np.ndarray) -> float:
    return float(x.sum())


def expected_total(seed: int) -> float:
    return float(np.arange(256, dtype=np.float64).sum() * seed)


class Chaos:
    """The schedule: kill -9 one process at a time, restart it after a short while.

    The thread lives until ``stop``, not just until the schedule is over (``finished``), so
    the daemons it restarted outlive it whatever their parent-death watch follows (it once
    followed the starting thread: see ``mpl.wire.lifetime``).
    """

    def __init__(self, cluster: Any, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.events: list[str] = []
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, name="chaos", daemon=True)

    def _run(self) -> None:
        try:
            self._schedule()
        finally:
            self.finished.set()
        self.stop.wait(300)

    def _schedule(self) -> None:
        impl = self.cluster.impl
        end = time.monotonic() + CHAOS_S
        while not self.stop.wait(self.rng.uniform(3.0, 6.0)) and time.monotonic() < end:
            down = self.rng.uniform(0.3, 1.5)
            if self.rng.random() < 0.3:
                self.events.append(f"broker down {down:.1f}s")
                impl.kill_broker()
                self.stop.wait(down)  # the schedule's own pause, not a wait for a condition
                impl.start_broker(wait=False)
            else:
                rank = self.rng.randrange(3)
                self.events.append(f"rank {rank} down {down:.1f}s")
                impl.kill_worker(rank)
                self.stop.wait(down)
                impl.start_worker(rank)


def _connect(address: str, job_timeout: float = JOB_TIMEOUT_S) -> mp.Context:
    ctx = mp.connect(address, timeout=JOB_TIMEOUT_S)
    ctx.client.job_timeout = job_timeout
    return ctx


def test_jobs_under_kill_9_of_workers_and_broker_end_right_or_typed(make_cluster: Any) -> None:
    rng = random.Random(SEED)
    cluster = make_cluster("tcp", spec=ClusterSpec.simple(3), job_timeout_s=COLD_JOB_TIMEOUT_S)
    address = cluster.address
    ctx = _connect(address, job_timeout=COLD_JOB_TIMEOUT_S)
    with ctx:  # warm up: every worker loads jax and compiles once, outside the schedule
        warm = mp.device("SP0")(lambda a, b: a + b)(mp.put("P0", 1.0), mp.put("P1", 2.0))
        assert abs(float(mp.fetch(warm, timeout=60)) - 3.0) < 1e-3
    ctx.client.job_timeout = JOB_TIMEOUT_S  # the schedule's jobs: warm workers, short bound
    chaos = Chaos(cluster, random.Random(SEED + 1))
    outcomes: dict[str, int] = {}
    first: dict[str, str] = {}  # the first message of each kind of error, for the report
    late: list[str] = []
    wrong: list[str] = []
    saved: dict[str, float] = {}  # name -> value, for saves that reported success
    tried: dict[str, float] = {}  # every save attempted
    chaos.thread.start()
    i = 0
    try:
        while not chaos.finished.is_set():
            i += 1
            kind = rng.choice(["move", "move", "spu", "save"])
            a, b = rng.sample(range(3), 2)

            def move(i: int = i, a: int = a, b: int = b) -> None:
                x = mp.device(f"P{a}")(make_block)(i)
                got = mp.fetch(mp.device(f"P{b}")(total)(x))
                if got != expected_total(i):
                    wrong.append(f"move {i}: {got} != {expected_total(i)}")

            def spu(i: int = i, a: int = a, b: int = b) -> None:
                s = mp.device("SP0")(lambda u, v: u * v)(mp.put(f"P{a}", i), mp.put(f"P{b}", 3))
                got = float(mp.fetch(s))
                if abs(got - 3 * i) > 1e-3:
                    wrong.append(f"spu {i}: {got} != {3 * i}")

            def save(i: int = i, a: int = a) -> None:
                name = f"chaos-{SEED}-{i}"
                tried[name] = expected_total(i)
                v = mp.device(f"P{a}")(total)(mp.device(f"P{a}")(make_block)(i))
                mp.save(v, name, persist=True)
                saved[name] = expected_total(i)

            unit: Callable[[], None] = {"move": move, "spu": spu, "save": save}[kind]
            started = time.monotonic()
            try:
                with ctx:
                    unit()
                outcome = "ok"
            except MplError as exc:  # a typed error is a right answer under chaos
                outcome = type(exc).__name__
                first.setdefault(f"{kind}:{outcome}", str(exc)[:300])
            elapsed = time.monotonic() - started
            if outcome != "ok":
                if outcome in ("SessionError", "MplTimeoutError"):  # the broker restarted?
                    ctx.close()
                    ctx = _reconnect(address)  # a new session
                chaos.stop.wait(0.1)  # pacing: a fast failure must not starve the daemons
            outcomes[f"{kind}:{outcome}"] = outcomes.get(f"{kind}:{outcome}", 0) + 1
            if elapsed > UNIT_BOUND_S:
                late.append(f"{kind} {i} took {elapsed:.1f}s ({outcome})")
    finally:
        ctx.close()
    try:
        _verify(cluster, address, chaos, outcomes, first, wrong, late, saved, tried, i)
    finally:
        chaos.stop.set()
        chaos.thread.join(30)


def _verify(
    cluster: Any,
    address: str,
    chaos: Chaos,
    outcomes: dict[str, int],
    first: dict[str, str],
    wrong: list[str],
    late: list[str],
    saved: dict[str, float],
    tried: dict[str, float],
    i: int,
) -> None:
    report = f"seed {SEED}, events {chaos.events}, outcomes {outcomes}, first errors {first}"
    assert not wrong, f"wrong values: {wrong}; {report}"
    assert not late, f"jobs past their bound: {late}; {report}"
    assert chaos.events and i >= 10, report
    assert sum(n for k, n in outcomes.items() if k.endswith(":ok")) >= 10, report
    print(report)  # shown with -rP: what this schedule did

    # everything comes back; a new session works and every persisted value reads back whole
    for rank, proc in cluster.impl.workers.items():
        if proc.poll() is not None:
            cluster.impl.start_worker(rank)
    cluster.impl.wait_ready(30)
    # a worker restarted late in the schedule (or just now) is cold: its first SPU op loads
    # jax and spu again
    with _reconnect(address, job_timeout=COLD_JOB_TIMEOUT_S) as after:
        moved = mp.device("P2")(total)(mp.device("P0")(make_block)(5))
        assert mp.fetch(moved) == expected_total(5)
        s = mp.device("SP0")(lambda u, v: u - v)(mp.put("P1", 9), mp.put("P2", 4))
        assert abs(float(mp.fetch(s, timeout=60)) - 5) < 1e-3
        for name, value in tried.items():
            try:
                got = mp.fetch(mp.load(name))
            except MplError:
                assert name not in saved, f"{name} was saved but does not load; {report}"
                continue
            assert got == value, f"{name} read back {got!r}, not {value!r}; {report}"
    after.close()


def _reconnect(address: str, job_timeout: float = JOB_TIMEOUT_S) -> mp.Context:
    """A new session, trying until the restarted broker answers (bounded)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return _connect(address, job_timeout)
        except MplError:
            if time.monotonic() > deadline:
                raise
