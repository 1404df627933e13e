"""Jobs in flight without waiting: ``mp.submit`` futures, ``mp.wait`` and ``mp.as_completed``,
under the in-process Simulator and under real daemons."""

from __future__ import annotations

import gc
import signal
from concurrent.futures import FIRST_COMPLETED, Future
from typing import Any

import pytest
from helpers import boom, nap_then, run_side_by_side, stable_objects, stats, wait_until

import mpl.driver as mp
from mpl.wire import GraphBuilder
from mpl.wire.errors import MplError, MplTimeoutError

WORLD_SIZE = 2  # of the shared sim / procs / ctx fixtures (conftest.py)


@mp.function
def step(x: mp.Value, i: int) -> mp.Value:
    out: mp.Value = mp.device("P1")(lambda a, b: a + b)(x, i)
    return out


@mp.function
def add_values(x: mp.Value, y: mp.Value) -> mp.Value:
    out: mp.Value = mp.device("P1")(lambda a, b: a + b)(x, y)
    return out


@mp.function
def pair(x: mp.Value) -> dict[str, Any]:
    return {"same": x, "twice": (mp.device("P0")(lambda a: a * 2)(x), "host")}


def test_a_future_holds_what_the_call_returns(ctx: mp.Context) -> None:
    x = mp.put("P0", 20)
    future = mp.submit(pair, x)
    assert isinstance(future, Future)
    out = future.result(timeout=30)
    called = pair(x)
    assert isinstance(out["twice"][0], mp.Value) and out["twice"][0].device == "P0"
    assert mp.fetch(out) == mp.fetch(called) == {"same": 20, "twice": (40, "host")}
    # a compiled Program and a plain traceable function are accepted too
    program = mp.compile(step, x, 1)
    assert mp.fetch(mp.submit(program, x, 1).result(timeout=30)) == 21
    plain = mp.submit(lambda v: mp.device("P0")(lambda a: a - 1)(v), x)
    assert mp.fetch(plain.result(timeout=30)) == 19


def test_64_in_flight_from_one_thread_each_with_its_own_result(ctx: mp.Context) -> None:
    x = mp.put("P0", 1000)
    ys = [mp.put("P1", i) for i in range(64)]
    traces = add_values.traces
    before = ctx.status()["jobs_done"]
    # The first job holds rank 1 for a while, so the others queue behind it in flight.
    slow = mp.submit(lambda v: mp.device("P1")(nap_then)(v, 0.8), x)
    futures = [mp.submit(add_values, x, y) for y in ys]
    wait_until(  # counted at the broker: the jobs are out together, not one at a time
        lambda: ctx.status()["jobs_in_flight"] >= 32, timeout=5, what="32 jobs in flight"
    )
    seen = list(mp.as_completed([slow, *futures]))
    assert len(seen) == 65 and set(seen) == {slow, *futures}
    assert [mp.fetch(f.result()) for f in futures] == [1000 + i for i in range(64)]
    assert mp.fetch(slow.result()) == 1000
    assert ctx.status()["jobs_done"] - before == 65
    assert add_values.traces - traces <= 1  # one trace serves all 64 (cached like a call)


def test_errors_surface_on_result_and_spare_the_other_jobs(ctx: mp.Context) -> None:
    x = mp.put("P0", 7)
    bad = mp.submit(lambda v: mp.device("P1")(boom)(v), x)
    good = mp.submit(step, x, 1)
    done, not_done = mp.wait([bad, good])
    assert done == {bad, good} and not not_done
    with pytest.raises(mp.RemoteError, match="boom on 7") as info:
        bad.result()
    assert info.value.rank == 1
    assert isinstance(bad.exception(), mp.RemoteError)
    assert mp.fetch(good.result()) == 8


def test_interleaved_submits_from_several_threads_land_on_their_own_futures(
    ctx: mp.Context,
) -> None:
    # The pump reads results in batches and settles the batch at the end: every value must
    # still reach its own future, and a failed job only its own.
    x = mp.put("P0", 1000)
    outcomes: dict[int, list[tuple[int, Any]]] = {}

    def submitter(t: int) -> Any:
        def run() -> None:
            futures = []
            for i in range(24):
                if i % 7 == 3:
                    futures.append((i, mp.submit(lambda v: mp.device("P1")(boom)(v), x)))
                else:
                    futures.append((i, mp.submit(step, x, 100 * t + i)))
            got = []
            for i, f in futures:
                try:
                    got.append((i, mp.fetch(f.result(timeout=60))))
                except mp.RemoteError as exc:
                    got.append((i, f"error: {exc}"))
            outcomes[t] = got

        return run

    # each thread enters the context (_in): a current context is per thread
    errors = run_side_by_side(*(_in(ctx, submitter(t)) for t in range(4)), timeout=120)
    assert not errors, errors
    for t in range(4):
        for i, got in outcomes[t]:
            if i % 7 == 3:
                assert isinstance(got, str) and "boom on 1000" in got
            else:
                assert got == 1000 + 100 * t + i


def _in(ctx: mp.Context, fn: Any) -> Any:
    def run() -> None:
        with ctx:
            fn()

    return run


def test_wait_first_completed(ctx: mp.Context) -> None:
    x = mp.put("P0", 1)
    slow = mp.submit(lambda v: mp.device("P0")(nap_then)(v, 0.5), x)
    quick = mp.submit(lambda v: mp.device("P1")(lambda a: a)(v), x)
    done, _ = mp.wait([slow, quick], return_when=FIRST_COMPLETED)
    assert done
    mp.wait([slow, quick])
    assert slow.done() and quick.done()


def test_dropping_inputs_after_submit_is_safe_and_results_are_freed(ctx: mp.Context) -> None:
    gc.collect()
    ctx.flush()
    baseline = stable_objects(ctx, 1)
    # A slow job first, so the jobs below wait in flight while their inputs are dropped and
    # the deletes of everything dropped so far go out.
    blocker = mp.submit(lambda: mp.device("P1")(nap_then)(0, 0.4))
    x = mp.put("P0", 5)
    futures = [mp.submit(step, x, i) for i in range(8)]
    del x
    gc.collect()
    ctx.flush()
    assert [mp.fetch(f.result(timeout=30)) for f in futures] == [5 + i for i in range(8)]
    blocker.result(timeout=30)
    del futures, blocker
    gc.collect()
    ctx.flush()
    wait_until(
        lambda: stats(ctx.client, 1)["objects"] <= baseline,
        timeout=15,
        what=f"rank 1 back to {baseline} objects",
    )


def test_closing_the_context_fails_pending_futures() -> None:
    ctx = mp.Simulator.simple(2)
    with ctx:
        x = mp.put("P0", 1)
        futures = [mp.submit(lambda v: mp.device("P0")(nap_then)(v, 1.0), x) for _ in range(3)]
    ctx.close()
    for f in futures:
        with pytest.raises(MplError, match="was closed while the job was in flight"):
            f.result(timeout=5)
    with pytest.raises(MplError, match="closed"), ctx:
        pass


def test_submit_inside_a_trace_is_refused(sim: mp.Context) -> None:
    @mp.function
    def nested(v: mp.Value) -> Any:
        return mp.submit(step, v, 1)

    with sim, pytest.raises(MplError, match=r"inside @mp\.function"):
        nested(mp.put("P0", 1))


def test_a_future_fails_at_its_deadline(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=(1, 3.0))[0]
    future = client.submit_async(sid, b.build([x]), {}, timeout=0.2)
    with pytest.raises(MplTimeoutError, match=r"within 0\.2 s"):
        future.result(timeout=10)  # the pump settles it; this bound only guards the test
    quick = GraphBuilder(2)
    y = quick.op("constant", [], ranks=(1,), value=3)[0]
    again = client.submit_async(sid, quick.build([y]), {}, inline=(0,), timeout=5)
    assert again.result(timeout=10).values[0] == {1: 3}


def test_a_silent_broker_fails_the_futures_in_flight(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client(heartbeat_s=0.2)
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=(1, 3.0))[0]
    futures = [client.submit_async(sid, b.build([x]), {}, timeout=60) for _ in range(3)]
    broker = cluster.impl.broker
    broker.send_signal(signal.SIGSTOP)  # silent, not gone: no socket closes
    try:
        for f in futures:
            with pytest.raises(MplTimeoutError, match="no heartbeat from the broker"):
                f.result(timeout=20)  # settled by the pump; this bound only guards the test
    finally:
        broker.send_signal(signal.SIGCONT)


def test_a_broker_killed_with_64_in_flight_fails_every_future(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client(heartbeat_s=0.2)
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=(1, 0.05))[0]
    graph = b.build([x])
    futures = [client.submit_async(sid, graph, {}, inline=(0,), timeout=60) for _ in range(64)]
    broker = cluster.impl.broker
    wait_until(lambda: any(f.done() for f in futures), timeout=30, what="a first result")
    broker.kill()  # gone mid-stream: some results came, the rest never will
    broker.wait(10)
    _, not_done = mp.wait(futures, timeout=30)  # this bound only guards the test
    assert not not_done
    settled = [f for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    assert settled and failed and len(settled) + len(failed) == 64
    assert all(f.result().values[0] == {0: 1} for f in settled)
    assert all(isinstance(e, MplError) for e in failed)


def test_futures_work_in_secure_mode(tmp_path: Any) -> None:
    # the pump thread seals programs and bindings and opens results, as blocking calls do
    with mp.local_cluster(2, secure=True, run_dir=tmp_path) as ctx, ctx:
        x = mp.put("P0", 20)
        futures = [mp.submit(step, x, i) for i in range(8)]
        assert [mp.fetch(f.result(timeout=30)) for f in futures] == [20 + i for i in range(8)]
        with pytest.raises(mp.RemoteError):
            mp.submit(boom_fn, x).result(timeout=30)


@mp.function
def boom_fn(x: mp.Value) -> mp.Value:
    out: mp.Value = mp.device("P0")(boom)(x)
    return out
