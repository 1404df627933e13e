"""The user API (``import mpl.driver as mp``), under the in-process Simulator and under real
daemons from ``mp.local_cluster``: the same programs, the same results."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import add, boom, double, stable_objects, stats, wait_until

import mpl.driver as mp


def stats_program(a: mp.Value, b: mp.Value) -> Any:
    """Per-party statistics combined at P2, with a loop unrolled by tracing."""
    sa = mp.device("P0")(lambda x: np.array([x.sum(), len(x)]))(a)
    sb = mp.device("P1")(lambda x: np.array([x.sum(), len(x)]))(b)
    total = mp.device("P2")(lambda u, v: u + v)(sa, sb)
    for _ in range(3):
        total = mp.device("P2")(lambda t: t * 1)(total)
    return mp.device("P2", nout=2)(lambda t: (t[0] / t[1], int(t[1])))(total)


def run_program(ctx: mp.Context) -> list[Any]:
    a = mp.put("P0", np.arange(10.0))
    b = mp.put("P1", np.arange(5.0, 15.0))
    eager = mp.fetch(list(stats_program(a, b)))
    compiled = mp.fetch(list(mp.function(stats_program)(a, b)))
    return [eager, compiled]


def test_same_program_same_results_in_simulator_and_daemons(
    sim: mp.Context, procs: mp.Context
) -> None:
    with sim:
        in_process = run_program(sim)
    with procs:
        distributed = run_program(procs)
    expected = [7.0, 20]
    assert in_process == [expected, expected] == distributed


def test_device_calls_move_arguments_and_return_values(ctx: mp.Context) -> None:
    x = mp.device("P0")(lambda: np.arange(4))()
    assert repr(x) == "Value(P0 @0, int64[4])"
    assert (x.device, x.parties) == ("P0", (0,))
    y = mp.device("P1")(add)(x, 10)  # x moves P0 -> P1; 10 travels as a host value
    assert y.parties == (1,)
    assert mp.fetch(y).tolist() == [10, 11, 12, 13]
    z = mp.device()(double)(y)  # inferred: the only device among the arguments
    assert z.device == "P1"
    assert mp.fetch({"z": z, "k": [3]}) == {"z": pytest.approx([20, 22, 24, 26]), "k": [3]}


def test_nout_and_indexing(ctx: mp.Context) -> None:
    q, r = mp.device("P0", nout=2)(divmod)(17, 5)
    assert (mp.fetch(q), mp.fetch(r)) == (3, 2)
    pair = mp.device("P1")(lambda: {"a": [1, 2], "b": 3})()
    assert mp.fetch(pair["a"][1]) == 2
    assert pair["b"].device == "P1"
    with pytest.raises(mp.RemoteError, match="must return a tuple of 3"):
        mp.device("P0", nout=3)(lambda: (1, 2))()


def test_device_errors(ctx: mp.Context) -> None:
    with pytest.raises(mp.DeviceNotFoundError, match=r"no device 'P9'.*P0, P1, P2, SP0"):
        mp.device("P9")(abs)(1)
    with pytest.raises(mp.DeviceInferenceError, match="no argument lives on a device"):
        mp.device()(abs)(1)
    a, b = mp.put("P0", 1), mp.put("P1", 2)
    with pytest.raises(mp.DeviceInferenceError, match="multiple PPU devices"):
        mp.device()(add)(a, b)
    with pytest.raises(mp.RemoteError) as info:
        mp.device("P2")(boom)(a)
    assert info.value.rank == 2 and info.value.remote_type == "ValueError"
    with pytest.raises(TypeError, match="no truth value"):
        bool(a)


def test_inference_prefers_the_single_secure_device(sim: mp.Context) -> None:
    from mpl.driver.devices import infer_device

    p0 = mp.Value("P0", (0,))
    s0 = mp.Value("SP0", (0, 1, 2))
    assert infer_device(sim.cluster, [p0, s0]) == "SP0"
    spec = mp.ClusterSpec.from_dict(
        {
            "nodes": [{"name": "a"}, {"name": "b"}],
            "devices": {
                "S1": {"kind": "SPU", "members": ["a", "b"]},
                "S2": {"kind": "SPU", "members": ["a", "b"]},
            },
        }
    )
    with pytest.raises(mp.DeviceInferenceError, match="Ambiguous"):
        infer_device(spec, [mp.Value("S1", (0, 1)), mp.Value("S2", (0, 1))])


def test_function_runs_as_one_job_and_is_cached(ctx: mp.Context) -> None:
    @mp.function
    def ten_ops(v: mp.Value) -> mp.Value:
        for _ in range(10):
            v = mp.device("P1")(lambda t: t + 1)(v)
        return v

    start = mp.put("P0", 0)
    before = ctx.status()["jobs_done"]
    out = ten_ops(start)
    assert ctx.status()["jobs_done"] - before == 1  # counted at the broker: ONE job
    assert mp.fetch(out) == 10
    again = ten_ops(mp.put("P0", 5))
    assert mp.fetch(again) == 15
    assert ten_ops.traces == 1  # same structure and placement: traced once
    program = mp.compile(ten_ops, start)
    text = str(program)
    assert text.count("pcall") == 10 and "shuffle[routing={1: 0}]" in text
    assert mp.fetch(program(start)) == 10


def test_eager_and_compiled_agree_with_host_values_and_captures(ctx: mp.Context) -> None:
    offset = mp.put("P1", 100)  # reached through the closure: becomes an input

    def f(x: mp.Value, k: int) -> tuple[mp.Value, str]:
        y = mp.device("P1")(lambda a, b, c: a * b + c)(x, k, offset)
        return y, "tag"

    x = mp.put("P0", 3)
    eager = f(x, 2)
    compiled = mp.function(f)(x, 2)
    assert compiled[1] == "tag"
    assert mp.fetch(eager[0]) == mp.fetch(compiled[0]) == 106


def test_simp_party_api(ctx: mp.Context) -> None:
    v = mp.simp.pcall((0, 1, 2), lambda: 7)
    assert v.parties == (0, 1, 2) and v.device is None
    assert mp.fetch(v) == [7, 7, 7]
    c = mp.simp.constant((1,), "hello")
    moved = mp.simp.shuffle(c, {0: 1, 2: 1})
    assert mp.fetch(moved) == ["hello", None, "hello"]
    parts = mp.simp.converge(mp.simp.constant((0,), 1), mp.simp.constant((2,), 3))
    assert mp.fetch(parts) == [1, None, 3]
    doubled = mp.simp.pcall((0, 2), double, parts)
    assert mp.fetch(doubled) == [2, None, 6]


def test_simp_errors_at_trace_time(ctx: mp.Context) -> None:
    v = mp.simp.constant((0,), 1)
    with pytest.raises(TypeError, match="routing must be a dict"):
        mp.simp.shuffle(v, [(1, 0)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be empty"):
        mp.simp.shuffle(v, {})
    with pytest.raises(ValueError, match="do not hold the input"):
        mp.simp.shuffle(v, {2: 1})
    with pytest.raises(ValueError, match="not covered"):
        mp.simp.pcall((0, 1), double, v)
    with pytest.raises(ValueError, match="disjoint"):
        mp.simp.converge(v, v)
    with pytest.raises(TypeError):
        mp.simp.converge(1)  # type: ignore[arg-type]


def test_collectives(ctx: mp.Context) -> None:
    x = mp.simp.constant((0,), np.array([1, 2]))
    assert mp.fetch(mp.collective.transfer(x, to=2)).tolist() == [1, 2]  # one party: no list
    assert mp.collective.transfer(x, to=0) is x
    rep = mp.collective.replicate(x, to=(1, 2))
    assert rep.parties == (1, 2)
    dist = mp.collective.distribute([mp.simp.constant((0,), i * 10) for i in range(3)], frm=0)
    assert mp.fetch(dist) == [0, 10, 20]
    gathered = mp.collective.collect(dist, to=1)
    assert [mp.fetch(g) for g in gathered] == [0, 10, 20]
    everyone = mp.collective.allreplicate(dist)
    assert mp.fetch(everyone[2]) == [20, 20, 20]
    assert mp.fetch(mp.collective.permute(dist, {0: 1, 1: 0})) == [10, 0, None]
    with pytest.raises(ValueError, match="held by one party"):
        mp.collective.transfer(dist, to=0)
    with pytest.raises(ValueError, match="non-empty"):
        mp.collective.distribute([], frm=0)


def test_names_and_two_drivers_on_one_session(ctx: mp.Context) -> None:
    name = f"shared-{id(ctx)}"
    first = mp.connect(ctx.address, session=name, share_with=["second"])
    second = mp.connect(ctx.address, session=name, driver="second")
    try:
        with first:
            model = mp.device("P2")(lambda: np.eye(2))()
            mp.save(model, "model")
        with second:
            loaded = mp.load("model")
            assert loaded.device == "P2"
            assert mp.fetch(loaded).tolist() == [[1, 0], [0, 1]]
            assert mp.fetch(mp.device("P2")(np.trace)(loaded)) == 2.0
            mp.delete("model")
            with pytest.raises(mp.SessionError, match="no value named 'model'"):
                mp.load("model")
    finally:
        first.close()
        second.close()


def test_context_works_from_another_thread(ctx: mp.Context) -> None:
    results: list[Any] = []

    def body() -> None:
        with ctx:
            results.append(mp.fetch(mp.device("P2")(lambda: "from a thread")()))

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    assert results == ["from a thread"]
    assert mp.get_context() is ctx  # this thread's stack is untouched


def test_dropped_values_are_freed_on_the_workers(ctx: mp.Context) -> None:
    import gc

    gc.collect()
    ctx.flush()
    baseline = stable_objects(ctx, 0)
    make = mp.device("P0")(lambda i: i)
    for i in range(2000):
        make(i)  # each result is dropped at once
    ctx.flush()
    wait_until(
        lambda: stats(ctx.client, 0)["objects"] <= baseline,
        timeout=15,
        what=f"rank 0 back to {baseline} objects",
    )


def test_trace_file(ctx: mp.Context, tmp_path: Path) -> None:
    mp.device("P1")(add)(mp.put("P0", 1), 2)
    path = mp.trace(str(tmp_path / "t.json"))
    events = json.loads(Path(path).read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("pid") == 1 and e["ph"] == "X"}
    assert any("pcall add" in n for n in names)
    assert any(e["ph"] == "M" and e["args"]["name"].startswith("rank 2") for e in events)


def test_no_context_is_a_clear_error() -> None:
    errors: list[BaseException] = []

    def body() -> None:  # a fresh thread: no `with ctx:` active, and no default set
        try:
            mp.put("P0", 1)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert isinstance(errors[0], mp.MplError) and "no mpl context" in str(errors[0])


def test_status_prints_a_table(ctx: mp.Context) -> None:
    status = ctx.status()
    assert [r["state"] for r in status["ranks"]] == ["up", "up", "up"]
    assert "rank  state" in str(status)
