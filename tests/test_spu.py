"""SPU devices: sealing, MPC runs over our own link, reveals, failures, concurrency."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import stats, wait_until

import mpl.driver as mp

pytestmark = pytest.mark.spu
mp.pickle_by_value(sys.modules[__name__])  # daemons do not have this module: send its code


def lt(a: Any, b: Any) -> Any:
    return a < b


def matmul(a: Any, b: Any) -> Any:
    return a @ b


@pytest.fixture(scope="module")
def sim3() -> Iterator[mp.Context]:
    ctx = mp.Simulator.simple(3)  # SEMI2K / FM128 (the default) over all three nodes
    with ctx:
        yield ctx
    ctx.close()


def test_millionaire_in_the_simulator(sim3: mp.Context) -> None:
    with sim3:
        x, y = mp.put("P0", 3_000_000), mp.put("P1", 5_000_000)
        z = mp.device("SP0")(lt)(x, y)
        assert repr(z) == "Value(SP0 @0,1,2, secret bool[])"
        assert mp.fetch(mp.put("P0", z)) == np.True_  # revealed to P0, then fetched
        assert bool(mp.fetch(z)) is True  # reconstructed at the driver


def test_inference_runs_mixed_arguments_on_the_spu(sim3: mp.Context) -> None:
    with sim3:
        secret = mp.device("SP0")(lambda a: a * 2)(mp.put("P0", np.arange(3.0)))
        bias = np.array([0.5, 0.5, 0.5])  # a host array: a public input
        out = mp.device()(lambda s, b, k: s + b + k)(secret, bias, 10)  # 10: a constant
        assert out.device == "SP0"
        assert np.allclose(mp.fetch(out), [10.5, 12.5, 14.5], atol=1e-3)
        first, second = mp.device("SP0", nout=2)(lambda a: (a + 1, a - 1))(secret)
        assert np.allclose(mp.fetch(first), [1, 3, 5], atol=1e-3)
        assert np.allclose(mp.fetch(second[1]), 1.0, atol=1e-3)  # indexing a secret stays secret


def test_host_values_put_on_the_spu_are_shared_by_the_driver(sim3: mp.Context) -> None:
    with sim3:
        s = mp.put("SP0", np.array([[1.0, 2.0], [3.0, 4.0]]))
        assert s.parties == (0, 1, 2)
        assert np.allclose(mp.fetch(mp.put("P2", s)), [[1, 2], [3, 4]])


def test_spu_to_spu_is_not_implemented(sim3: mp.Context) -> None:
    spec = mp.ClusterSpec.simple(3)
    spec.devices["SP1"] = type(spec.devices["SP0"])("SP1", "SPU", ("node1", "node2"), {})
    with sim3:
        s = mp.put("SP0", np.ones(2))
        other = mp.Value("SP1", (1, 2), ctx=sim3)
        from mpl.driver.devices import move
        from mpl.driver.recorder import Recorder

        with pytest.raises(NotImplementedError, match="SPU to SPU"):
            move(Recorder(spec, traced=True), s, "SP1")
        del other


@pytest.mark.parametrize(
    ("world", "protocol", "field", "n"),
    [
        (2, "SEMI2K", "FM64", 20),
        (3, "SEMI2K", "FM64", 20),
        (3, "ABY3", "FM64", 20),
        (2, "CHEETAH", "FM64", 4),  # CHEETAH's setup is heavy: keep the matrices small
    ],
)
def test_matmul_against_numpy(world: int, protocol: str, field: str, n: int) -> None:
    sim = mp.Simulator.simple(world, spu_protocol=protocol, spu_field=field)
    try:
        with sim:
            rng = np.random.default_rng(world)
            a, b = rng.random((n, n)), rng.random((n, n))
            c = mp.device("SP0")(matmul)(mp.put("P0", a), mp.put(f"P{world - 1}", b))
            assert np.abs(mp.fetch(mp.put("P0", c)) - a @ b).max() < 1e-2
    finally:
        sim.close()


def test_spu_on_a_subset_with_data_from_outside() -> None:
    sim = mp.Simulator.simple(3, spu_members=[1, 2])
    try:
        with sim:
            data = mp.put("P0", np.array([1.0, 2.0, 3.0]))  # P0 is not an SPU member
            total = mp.device("SP0")(lambda v: v.sum())(data)
            assert total.parties == (1, 2)
            assert abs(float(mp.fetch(mp.put("P0", total))) - 6.0) < 1e-3
    finally:
        sim.close()


def test_compile_cache_is_hit(sim3: mp.Context) -> None:
    with sim3:
        f = mp.device("SP0")(lambda a, b: a * b + 1)
        x, y = mp.put("P0", np.ones(4)), mp.put("P1", np.ones(4))
        before = _spu_counts(sim3)
        for _ in range(3):
            f(x, y)
        after = _spu_counts(sim3)
        assert after["spu_compiles"] - before["spu_compiles"] == 3  # once per member
        assert after["spu_cache_hits"] - before["spu_cache_hits"] == 6  # then hits
        f(mp.put("P0", np.ones(5)), mp.put("P1", np.ones(5)))
        assert _spu_counts(sim3)["spu_compiles"] - after["spu_compiles"] == 3  # new shapes


def _spu_counts(ctx: mp.Context) -> dict[str, int]:
    """SPU counters summed over the simulator's workers (read directly, not via heartbeats)."""
    workers = ctx.runtime.workers  # type: ignore[attr-defined]
    total: dict[str, int] = {}
    for w in workers:
        for k, v in w.stats().items():
            if k.startswith("spu_"):
                total[k] = total.get(k, 0) + v
    return total


def test_two_sessions_use_the_spu_concurrently(sim3: mp.Context) -> None:
    other = mp.connect(sim3.address)
    results: dict[str, Any] = {}

    def session(ctx: mp.Context, key: str, n: int) -> None:
        with ctx:
            a = mp.put("P0", np.full(8, float(n)))
            for _ in range(3):
                a = mp.device("SP0")(lambda v: v + 1)(a)
            results[key] = mp.fetch(a)

    try:
        threads = [
            threading.Thread(target=session, args=(c, k, n))
            for c, k, n in ((sim3, "one", 1), (other, "two", 100))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert np.allclose(results["one"], 4) and np.allclose(results["two"], 103)
    finally:
        other.close()


def test_compile_errors_come_back_as_remote_errors(sim3: mp.Context) -> None:
    with sim3:
        x = mp.put("P0", np.ones(3))
        with pytest.raises(mp.RemoteError) as info:
            mp.device("SP0")(lambda a: a @ np.ones((7, 7)))(x)  # shapes do not match
        assert info.value.rank in (0, 1, 2) and "spu.run" in info.value.op


def test_logistic_regression_example_converges() -> None:
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "logistic_regression.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("lr_example", path)
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    sys.modules["lr_example"] = example
    spec.loader.exec_module(example)
    from mpl.wire.codec import pickle_by_value

    pickle_by_value(example)
    sim = mp.Simulator.simple(3)
    try:
        with sim:
            w_mpc = mp.fetch(example.fit())
        w_plain = example.train(*example.dataset())
        assert np.allclose(w_mpc, w_plain, atol=2e-2), (w_mpc, w_plain)
    finally:
        sim.close()


@pytest.mark.daemons
def test_millionaire_on_daemons_and_a_member_killed_mid_run(tmp_path: Any) -> None:
    spec = mp.ClusterSpec.simple(2, spu_protocol="SEMI2K", spu_field="FM128")
    with mp.local_cluster(spec, run_dir=tmp_path) as ctx:
        # shares bound into a fresh worker's first job, and fetched back through a broker
        # that never loads the share records: they pass through it opaque
        secret = mp.put("SP0", np.arange(6.0))
        assert np.allclose(mp.fetch(secret), np.arange(6.0))
        z = mp.device("SP0")(lt)(mp.put("P0", 3), mp.put("P1", 5))
        assert bool(mp.fetch(mp.put("P0", z))) is True
        # a long SPU run (60 chained matmuls), then rank 1 is killed while rank 0 is in it
        errors: list[BaseException] = []

        def long_run(a: Any) -> Any:
            out = a
            for _ in range(60):
                out = out @ a
            return out

        def run() -> None:
            try:
                with ctx:
                    mp.device("SP0")(long_run)(mp.put("P0", np.eye(80) * 0.5))
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        wait_until(lambda: stats(ctx.client, 0).get("jobs_running") == 1, what="the SPU job")
        killed = time.monotonic()
        ctx.processes.kill_worker(1)
        t.join(15)
        assert time.monotonic() - killed < 5
        assert errors and isinstance(errors[0], mp.WorkerLostError), errors
        # the survivor's SPU runtime was released: it runs new work at once
        wait_until(lambda: stats(ctx.client, 0).get("jobs_running") == 0, what="rank 0 free")
        assert mp.fetch(mp.device("P0")(lambda: "alive")()) == "alive"


def test_lanes_are_reused_and_rebuilt_after_a_failure(sim3: mp.Context) -> None:
    with sim3:
        x = mp.put("P0", np.arange(4.0))
        before = _spu_counts(sim3).get("spu_lanes", 0)
        inc = mp.device("SP0")(lambda a: a + 1)
        for _ in range(3):
            x = inc(x)
        assert _spu_counts(sim3)["spu_lanes"] - before == 3  # one lane per member, reused
        with pytest.raises(mp.RemoteError):
            mp.device("SP0")(lambda a: a @ np.ones((9, 9)))(x)  # fails: every member drops
        x = inc(x)  # a fresh lane, agreed on by every member
        assert np.allclose(mp.fetch(x), [4, 5, 6, 7], atol=1e-3)
        assert _spu_counts(sim3)["spu_lanes"] - before == 6
