"""Eager device calls on a cache hit replay a recorded plan: counted, not timed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from helpers import add

import mpl.driver as mp
from mpl.driver import eager
from mpl.driver.job_site import JobSite
from mpl.driver.values import NOT_CACHED
from mpl.wire.errors import MplError

if TYPE_CHECKING:
    from mpl.driver.launcher import LocalCluster


def counts() -> tuple[int, int]:
    return eager.stats["recorded"], eager.stats["replayed"]


def test_a_repeated_call_records_once_then_replays(ctx: mp.Context) -> None:
    def scale(v: np.ndarray, k: float) -> np.ndarray:
        return v * k

    call = mp.device("P1")(scale)
    recorded, replayed = counts()
    jobs = ctx.status()["jobs_done"]
    first = call(mp.put("P0", np.ones(3)), 2.0)  # a move P0 -> P1 and the call
    assert counts() == (recorded + 1, replayed)
    results = []
    for i in range(20):  # new Values in the same place, new host values: same plan
        results.append(mp.device("P1")(scale)(mp.put("P0", np.full(3, i)), 10.0 + i))
    assert counts() == (recorded + 1, replayed + 20)
    assert ctx.status()["jobs_done"] - jobs == 2 * 21  # still one job per put and per call
    np.testing.assert_array_equal(mp.fetch(first), [2.0, 2.0, 2.0])
    for i, r in enumerate(results):
        np.testing.assert_array_equal(mp.fetch(r), np.full(3, i * (10.0 + i)))
        assert r.device == "P1" and r.parties == (1,)


def test_placement_structure_and_aliasing_each_get_their_own_plan(ctx: mp.Context) -> None:
    on_p0, on_p1 = mp.put("P0", 3), mp.put("P1", 4)
    call = mp.device("P2")(add)
    recorded, _ = counts()
    assert mp.fetch(call(on_p0, on_p1)) == 7
    assert mp.fetch(call(on_p1, on_p0)) == 7  # other moves: another plan
    assert mp.fetch(call(on_p0, on_p0)) == 6  # one Value twice is one input: another plan
    assert mp.fetch(call(on_p0, 10)) == 13  # a host leaf: another plan
    assert mp.fetch(call(a=on_p0, b=on_p1)) == 7  # keywords: another structure
    assert counts()[0] == recorded + 5
    again = [call(on_p0, on_p1), call(on_p1, on_p0), call(on_p0, on_p0), call(on_p0, 5)]
    assert counts()[0] == recorded + 5  # all four replayed
    assert mp.fetch(again) == [7, 7, 6, 8]
    pair = mp.device("P1", nout=2)(lambda a: (a, a + 1))
    assert mp.fetch(list(pair(on_p0))) == [3, 4]
    assert mp.fetch(list(pair(mp.put("P0", 8)))) == [8, 9]


def test_values_of_another_context_are_still_refused(ctx: mp.Context) -> None:
    other = mp.Simulator.simple(3)
    try:
        with other:
            foreign = mp.put("P0", 1)
        call = mp.device("P1")(add)
        with pytest.raises(MplError, match="another context"):
            call(foreign, 1)
        with pytest.raises(MplError, match="another context"):
            call(foreign, 1)  # never cached
    finally:
        other.close()


def test_a_call_without_arguments_replays_its_plan_in_its_own_cluster_only(
    sim: mp.Context,
) -> None:
    """Such a call's plan is found without flattening or a key; a context on another
    cluster gets its own plan, and a call inside a trace is traced, not replayed."""
    import sys
    from collections import Counter

    other = mp.Simulator.simple(2)
    try:
        one = mp.device("P0")(lambda: 1)
        recorded, replayed = counts()
        for turn in (sim, other, sim, other):
            with turn:
                assert mp.fetch(one()) == 1
        assert counts() == (recorded + 2, replayed + 2)
        calls: Counter[str] = Counter()

        def count(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls[frame.f_code.co_name] += 1

        with other:
            sys.setprofile(count)
            try:
                values = [mp.fetch(one()) for _ in range(5)]
            finally:
                sys.setprofile(None)
        assert values == [1] * 5 and counts() == (recorded + 2, replayed + 7)
        assert calls["plan_key"] == calls["_flatten"] == calls["lookup"] == 0
        with sim:
            assert mp.fetch(mp.function(lambda: one())()) == 1
        assert counts() == (recorded + 2, replayed + 7)
    finally:
        other.close()


def test_function_calls_inside_a_trace_do_not_touch_the_plans(sim: mp.Context) -> None:
    @mp.function
    def twice(v: mp.Value) -> mp.Value:
        out: mp.Value = mp.device("P1")(add)(v, v)
        return out

    with sim:
        x = mp.put("P0", 21)
        before = counts()
        assert mp.fetch(twice(x)) == 42
        assert counts() == before


class _Jobs:
    """Every job the driver is asked to run (the graph and its bindings), then runs it: what
    a call site (mpl.driver.job_site) or the context runs, each job once (a call site that
    hands its job to the context is not counted again). ``close`` ends the watch."""

    def __init__(self, ctx: mp.Context) -> None:
        self.graphs: list[Any] = []
        self.bindings: list[dict[int, list[Any]]] = []
        self._ctx = ctx
        self._site_run = JobSite.run
        self._depth = 0  # inside a call site's run
        jobs = self

        def site_run(site: JobSite, bindings: Any) -> Any:
            jobs._note(site.graph, bindings)
            jobs._depth += 1
            try:
                return jobs._site_run(site, bindings)
            finally:
                jobs._depth -= 1

        def ctx_run(graph: Any, bindings: Any, **kw: Any) -> Any:
            if not jobs._depth:
                jobs._note(graph, bindings)
            return type(ctx).run(ctx, graph, bindings, **kw)

        JobSite.run = site_run  # type: ignore[method-assign, assignment]
        ctx.run = ctx_run  # type: ignore[method-assign]

    def _note(self, graph: Any, bindings: Any) -> None:
        self.graphs.append(graph)
        self.bindings.append(bindings)

    def close(self) -> None:
        JobSite.run = self._site_run  # type: ignore[method-assign]
        del self._ctx.run


def test_an_eager_move_of_a_value_the_driver_holds_is_one_job_on_the_callee(
    ctx: mp.Context,
) -> None:
    small = mp.put("P0", np.arange(4.0))  # small: its data came back with its job
    big = mp.put("P0", np.ones(20_000))  # 160 kB: only P0 holds it
    assert small.cached(0) is not NOT_CACHED and big.cached(0) is NOT_CACHED
    jobs = _Jobs(ctx)
    try:
        for i in range(3):  # recorded once, then replayed
            got = mp.device("P1")(add)(small, float(i))
            np.testing.assert_array_equal(mp.fetch(got), np.arange(4.0) + i)
            assert got.device == "P1" and got.parties == (1,)
        moved = mp.device("P1")(np.sum)(big)
        assert mp.fetch(moved) == 20_000.0
    finally:
        jobs.close()
    assert len(jobs.graphs) == 4  # one job per call, nothing else sent
    for graph, bindings in zip(jobs.graphs[:3], jobs.bindings[:3], strict=True):
        assert graph.ranks == (1,) and "shuffle" not in graph.opcodes  # no move between workers
        assert set(bindings) == {1}  # only the callee takes part
    assert "shuffle" in jobs.graphs[3].opcodes and jobs.graphs[3].ranks == (0, 1)


def test_a_traced_program_moves_between_workers_even_when_the_driver_holds_the_value(
    ctx: mp.Context,
) -> None:
    @mp.function
    def on_p1(v: mp.Value) -> mp.Value:
        out: mp.Value = mp.device("P1")(add)(v, 1)
        return out

    x = mp.put("P0", 41)
    assert x.cached(0) == 41
    jobs = _Jobs(ctx)
    try:
        assert mp.fetch(on_p1(x)) == 42
    finally:
        jobs.close()
    assert "shuffle" in jobs.graphs[0].opcodes  # the program is reused for any P0 value


def test_the_drivers_copy_is_sealed_for_the_callee_in_secure_mode(tmp_path: Path) -> None:
    ctx: LocalCluster
    with mp.local_cluster(2, secure=True, run_dir=tmp_path) as ctx, ctx:
        x = mp.put("P0", np.arange(3.0))
        jobs = _Jobs(ctx)
        try:
            results = [mp.fetch(mp.device("P1")(np.multiply)(x, float(k))) for k in range(3)]
        finally:
            jobs.close()
        for k, got in enumerate(results):
            np.testing.assert_array_equal(got, np.arange(3.0) * k)
        assert [g.ranks for g in jobs.graphs] == [(1,)] * 3  # one job on the callee each
