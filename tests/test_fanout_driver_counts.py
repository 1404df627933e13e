"""What the driver does per rank of a fan-out job (a pcall on every rank), counted.

The driver's work per job should not grow with the job's ranks beyond what msgpack builds
for the answer: its checks of each rank's value and stats blob, as Python loops, are the
only per-rank Python left. Counted here as calls (Python functions and builtins) on the
calling thread under the in-process Simulator, at two world sizes, and for the batched
``Delete`` that frees the jobs' outputs, per dropped Value.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import call_counter, run_profiled, wait_until

import mpl.driver as mp
import mpl.driver.context as context_module
import mpl.driver.job_site as job_site
from mpl.wire.errors import MplError

# Calls (Python and builtins) per job that a rank adds, world 8 against world 2. 371bb90:
# 1.0 (fetch_one's dict.get per rank, filling the list by rank in a Python loop); now 0
# (every rank's value read by one itemgetter, in C).
PER_RANK = 0.25
# Calls per dropped Value of a fan-out on 8 ranks when the batch of deletes goes out.
# 371bb90: 18 (a setdefault and an append per rank of each Value); now 4 (the URIs grouped
# by the Values' ranks: a lookup and an append per Value, besides taking it off the queue;
# one list then serves every rank).
PER_RELEASED = 5


def _hold_deletes(monkeypatch: pytest.MonkeyPatch) -> None:
    """No batch of deletes goes out by itself (by age) while calls are counted."""
    monkeypatch.setattr(job_site, "_DELETE_EVERY_S", 1e9)
    monkeypatch.setattr(context_module, "_DELETE_EVERY_S", 1e9)


@contextlib.contextmanager
def _closing(sim: Any) -> Iterator[None]:
    """``sim`` current in this thread, and closed at the end."""
    try:
        with sim:
            yield
    finally:
        sim.close()


def _calls_per_job(world: int, n: int = 40) -> tuple[float, Counter[str]]:
    sim = mp.Simulator.simple(world)
    with _closing(sim):
        ranks = tuple(range(world))
        job = mp.function(lambda: mp.simp.pcall(ranks, lambda: 1))
        for _ in range(20):  # traced, program sent, caches warm
            assert mp.fetch(job()) == [1] * world
        sim.flush()
        calls: Counter[str] = Counter()
        results = run_profiled(call_counter(calls), lambda: mp.fetch(job()), n)
        assert results == [[1] * world] * n
        del calls["C setprofile"]
        return sum(calls.values()) / n, calls


def test_calls_per_fan_out_job_do_not_grow_with_its_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hold_deletes(monkeypatch)
    small, _ = _calls_per_job(2)
    large, calls = _calls_per_job(8)
    per_rank = (large - small) / 6
    print(f"{small} calls per job at world 2, {large} at world 8: {calls.most_common(12)}")
    assert per_rank <= PER_RANK


def test_a_batch_of_deletes_costs_calls_per_dropped_value_not_per_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hold_deletes(monkeypatch)
    world, n = 8, 200
    sim = mp.Simulator.simple(world)
    with _closing(sim):
        job = mp.function(lambda: mp.simp.pcall(tuple(range(world)), lambda: 1))
        kept = [job() for _ in range(n)]
        sim.flush()
        uris = [v._uri for v in kept[:3]]
        assert all(sim.fetch_raw(r, uri) == 1 for uri in uris for r in range(world))
        del kept  # every output dropped: queued, not sent
        gc.collect()
        assert len(sim._released) == n
        calls: Counter[str] = Counter()
        count = call_counter(calls)

        sys.setprofile(count)
        try:
            sim.flush()
        finally:
            sys.setprofile(None)
        per_value = sum(calls.values()) / n
        print(f"{per_value} calls per dropped value: {calls.most_common(12)}")
        assert not sim._released
        assert per_value <= PER_RELEASED

        def freed() -> bool:  # every rank dropped them (the Delete reached each)
            for uri in uris:
                for rank in range(world):
                    try:
                        sim.fetch_raw(rank, uri)
                    except MplError:
                        continue
                    return False
            return True

        wait_until(freed, timeout=15, what="the dropped values freed on every rank")
