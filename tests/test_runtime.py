"""The brokered runtime end to end, over inproc:// in one process and over tcp:// with real
mpl-broker / mpl-worker processes: the same tests on both."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from helpers import add, boom, double, make_array, nap_then, one, stats, wait_until

from mpl.wire import Arg, GraphBuilder, MplTimeoutError, RemoteError, SessionError
from mpl.wire.jobs import output_uri
from mpl.wire.sessions import SymbolInfo


def test_constant_shuffle_pcall_fetch(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("constant", [], ranks=(0,), value=np.arange(4))[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
    z = b.op("pcall", [y], ranks=(1,), fn=b.fn(double))[0]
    result = client.submit(sid, b.build([z]), {})
    assert result.values == {}  # nothing inline unless asked
    assert client.fetch(sid, 1, output_uri(result.job, 0)).tolist() == [0, 2, 4, 6]
    with pytest.raises(SessionError, match="no value"):
        client.fetch(sid, 0, output_uri(result.job, 0))  # rank 0 does not hold the output


def test_small_outputs_ride_inside_the_reply(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    v = b.op("pcall", [], ranks=(0, 1), fn=b.fn(one))[0]
    big = b.op("pcall", [], ranks=(0,), fn=b.fn(make_array), args=(100_000,))[0]
    result = client.submit(sid, b.build([v, big]), {}, inline=(0, 1))
    assert result.values[0] == {0: 1, 1: 1}
    assert 1 not in result.values  # 800 kB is not small: fetch it instead
    assert client.fetch(sid, 0, output_uri(result.job, 1)).shape == (100_000,)


def test_repeated_shuffles_in_one_job(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=(0,), value=1)[0]
    for step in range(6):
        src, dst = step % 2, 1 - step % 2
        moved = b.op("shuffle", [v], ranks=(0, 1), routing={dst: src})[0]
        v = b.op("pcall", [moved], ranks=(dst,), fn=b.fn(double))[0]
    result = client.submit(sid, b.build([v]), {}, inline=(0,))
    assert result.values[0] == {0: 64}


def test_three_party_routing_broadcast_and_swap(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport, 3)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(3)
    x = b.op("constant", [], ranks=(0,), value="from-0")[0]
    fan = b.op("shuffle", [x], ranks=(0, 1, 2), routing={1: 0, 2: 0})[0]
    a = b.op("constant", [], ranks=(1,), value=1)[0]
    c = b.op("constant", [], ranks=(2,), value=2)[0]
    both = b.op("converge", [a, c], ranks=(1, 2))[0]
    swapped = b.op("shuffle", [both], ranks=(1, 2), routing={1: 2, 2: 1})[0]
    result = client.submit(sid, b.build([fan, swapped]), {}, inline=(0, 1))
    assert result.values[0] == {1: "from-0", 2: "from-0"}
    assert result.values[1] == {1: 2, 2: 1}


def test_inputs_bound_by_uri_and_literal(make_cluster: Any, transport: str) -> None:
    from mpl.wire.jobs import Lit

    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    a = b.input((0,))
    k = b.input((0,))
    s = b.op("pcall", [a, k], ranks=(0,), fn=b.fn(add))[0]
    g = b.build([s])
    first = client.submit(sid, g, {0: [Lit(np.ones(3)), Lit(1.0)]})
    again = client.submit(sid, g, {0: [output_uri(first.job, 0), Lit(10.0)]}, inline=(0,))
    assert again.values[0][0].tolist() == [12.0, 12.0, 12.0]


def test_two_sessions_run_at_once_and_stay_isolated(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    slow, fast = client.open_session().session, client.open_session().session
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=("slow", 1.0))[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
    slow_graph = b.build([y])
    done: dict[str, float] = {}

    def run_slow() -> None:
        client.submit(slow, slow_graph, {})
        done["slow"] = time.monotonic()

    t = threading.Thread(target=run_slow)
    start = time.monotonic()
    t.start()
    f = GraphBuilder(2)
    v = f.op("constant", [], ranks=(0,), value=5)[0]
    w = f.op("shuffle", [v], ranks=(0, 1), routing={1: 0})[0]
    fast_result = client.submit(fast, f.build([w]), {}, inline=(0,))
    done["fast"] = time.monotonic()
    t.join(10)
    assert fast_result.values[0] == {1: 5}
    assert done["fast"] - start < 0.8 < done["slow"] - start  # the fast session did not wait
    with pytest.raises(SessionError):
        client.fetch(fast, 1, output_uri("nope", 0))


def test_remote_error_names_rank_op_and_traceback(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("constant", [], ranks=(0,), value=3)[0]
    bad = b.op("pcall", [x], ranks=(0,), fn=b.fn(boom))[0]
    moved = b.op("shuffle", [bad], ranks=(0, 1), routing={1: 0})[0]  # rank 1 waits for this
    start = time.monotonic()
    with pytest.raises(RemoteError) as info:
        client.submit(sid, b.build([moved]), {})
    err = info.value
    assert err.rank == 0
    assert "pcall boom" in err.op
    assert err.remote_type == "ValueError"
    assert "boom on 3" in str(err)
    assert "in boom" in err.remote_traceback
    assert time.monotonic() - start < 3  # rank 1 was released, not left waiting
    ok = GraphBuilder(2)
    v = ok.op("pcall", [], ranks=(1,), fn=ok.fn(one))[0]
    assert client.submit(sid, ok.build([v]), {}, inline=(0,), timeout=5).values[0] == {1: 1}


def test_missing_move_times_out_with_a_clear_error(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=(1, 2.0))[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
    with pytest.raises(RemoteError, match="did not arrive in time") as info:
        client.submit(sid, b.build([y]), {}, timeout=0.5)
    assert info.value.rank == 1
    assert info.value.remote_type == "MplTimeoutError"


def test_driver_deadline_raises_mpl_timeout(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    nap_s = 5.0
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=(1, nap_s))[0]
    start = time.monotonic()
    with pytest.raises(MplTimeoutError):  # nothing waits on a peer here: only the driver gives up
        client.submit(sid, b.build([x]), {}, timeout=0.3)
    # the job started after `start` and naps nap_s: the driver gave up before it could end,
    # so at its own deadline, not the job's (however loaded the machine)
    assert time.monotonic() - start < nap_s
    assert isinstance(MplTimeoutError("x"), TimeoutError)


def test_fetch_is_answered_during_a_long_job(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=(0,), value=42)[0]
    first = client.submit(sid, b.build([v]), {})
    slow = GraphBuilder(2)
    nap_s = 3.0
    s = slow.op("pcall", [], ranks=(0,), fn=slow.fn(nap_then), args=(0, nap_s))[0]
    t = threading.Thread(target=client.submit, args=(sid, slow.build([s]), {}))
    submitted = time.monotonic()
    t.start()
    wait_until(lambda: stats(client, 0).get("jobs_running") == 1, what="the slow job to run")
    assert client.fetch(sid, 0, output_uri(first.job, 0)) == 42
    # the slow job started after `submitted` and naps nap_s: the fetch came back before it
    # could end, so it was not queued behind it (however loaded the machine)
    assert time.monotonic() - submitted < nap_s
    t.join(10)


def test_deletes_free_objects(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=(0, 1), value=1)[0]
    g = b.build([v])
    jobs = [client.submit(sid, g, {}).job for _ in range(20)]
    wait_until(lambda: stats(client, 0).get("objects") == 20, what="20 objects on rank 0")
    client.delete(
        sid, {0: [output_uri(j, 0) for j in jobs], 1: [output_uri(j, 0) for j in jobs[:5]]}
    )
    wait_until(lambda: stats(client, 0).get("objects") == 0, what="rank 0 emptied")
    wait_until(lambda: stats(client, 1).get("objects") == 15, what="rank 1 partly emptied")


def test_named_values(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    owner, other = cluster.client(), cluster.client()
    sid = owner.open_session("shared", share_with=[other.driver]).session
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=(1,), value=[1, 2])[0]
    job = owner.submit(sid, b.build([v]), {}).job
    info = SymbolInfo("pair", "P1", (1,), False, {})
    owner.save_symbol(sid, output_uri(job, 0), info)
    joined = other.open_session("shared")
    assert joined.attached and joined.session == sid
    assert other.load_symbol(sid, "pair") == info
    assert other.fetch(sid, 1, "sym:pair") == [1, 2]
    other.delete_symbol(sid, "pair")
    with pytest.raises(SessionError, match="no value named 'pair'"):
        other.load_symbol(sid, "pair")


def test_session_lease_expiry_frees_objects(make_cluster: Any, transport: str) -> None:
    # the workers at the default heartbeat: at 0.25 s a loaded machine's 0.75 s of silence
    # lost a rank mid-job (the lease is the driver's: its heartbeat, below, renews it)
    cluster = make_cluster(transport)
    watcher = cluster.client()
    # the driver renews its 1 s lease four times a lease (not once, at the default 1 s
    # heartbeat): a slow machine must not expire it while the driver is still there
    driver = cluster.client(heartbeat_s=0.25)
    sid = driver.open_session(lease_s=1.0).session
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=(0, 1), value=np.zeros(10))[0]
    g = b.build([v])
    for _ in range(5):
        driver.submit(sid, g, {})
    wait_until(lambda: stats(watcher, 1).get("objects") == 5, what="5 objects")
    driver.close()  # the driver vanishes without closing its session
    wait_until(lambda: not watcher.status()["sessions"], timeout=20, what="the lease to expire")
    wait_until(lambda: stats(watcher, 0).get("objects") == 0, what="rank 0 freed")
    wait_until(lambda: stats(watcher, 1).get("objects") == 0, what="rank 1 freed")
    with pytest.raises(SessionError, match="unknown session"):
        watcher.fetch(sid, 0, "x")


def test_status_reports_ranks_and_sessions(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    client.open_session("named")
    status = client.status()
    assert [r["state"] for r in status["ranks"]] == ["up", "up"]
    assert {s["name"] for s in status["sessions"]} == {"named"}
    from mpl.wire.status import format_status

    text = format_status(status)
    assert "rank" in text and "named" in text and "up" in text


def test_pcall_template_args(make_cluster: Any, transport: str) -> None:
    cluster = make_cluster(transport)
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("constant", [], ranks=(0,), value=2)[0]
    y = b.op("pcall", [x], ranks=(0,), fn=b.fn(add), args=(Arg(0),), kwargs={"b": 40})[0]
    assert client.submit(sid, b.build([y]), {}, inline=(0,)).values[0] == {0: 42}
