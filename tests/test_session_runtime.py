"""A session's runtime_info reaches its nodes' workers (issue 11, gap 3): bounded, checked
against what each worker runs when the session opens (a refusal fails the open), seen by
kernels, and shown by ``mp.sessions()``."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mpl.driver as mp
from mpl.wire import ClusterSpec
from mpl.wire.errors import ClusterSpecError
from mpl.wire.limits import MAX_RUNTIME_INFO_ITEMS
from mpl.wire.runtime_info import MPL_VERSION, incompatibility, matches, own_runtime
from mpl.worker.kernel_table import runtime_info


def _node_runtime_info() -> dict[str, Any]:
    return runtime_info()


# registered on the simulator's workers with ``kernels=[this module]``
MPL_KERNELS = {"test.runtime_info": _node_runtime_info}


def _spec(infos: dict[str, dict[str, Any]]) -> ClusterSpec:
    """A session spec naming ``infos``' nodes, each with that runtime_info and a PPU."""
    return ClusterSpec.from_dict(
        {
            "nodes": [{"name": n, "runtime_info": info} for n, info in infos.items()],
            "devices": {f"D{n[-1]}": {"kind": "PPU", "members": [n]} for n in infos},
        }
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[mp.Simulator]:
    spec = ClusterSpec.simple(3, runtime_version="2.5", runtime_platform="tee-sgx")
    kernels = {"kernels": [__name__]}
    ctx = mp.Simulator(spec, worker_options={r: kernels for r in range(3)})
    yield ctx
    ctx.close()


def test_the_compatibility_rule() -> None:
    assert matches("N/A", "0.1.0") and matches("simulated", "x") and matches("", "x")
    assert matches("0.1", "0.1.0") and matches("0", "0.1.0") and matches("0.1.0", "0.1.0")
    assert not matches("0.2", "0.1.0") and not matches("0.1.0.1", "0.1.0")
    assert not matches("1", "10.0")  # a prefix counts only at a separator
    assert matches("LINUX", "linux-x86_64") and not matches("darwin", "linux-x86_64")
    own = own_runtime()
    assert incompatibility({"version": own["version"], "platform": own["platform"]}, own) is None
    why = incompatibility({"version": "99", "platform": "N/A"}, own, {"version": "2.5"})
    assert why is not None and "runtime_info.version '99'" in why and "'2.5'" in why
    assert (
        incompatibility(
            {"version": "2", "platform": "tee"}, own, {"version": "2.5", "platform": "tee-sgx"}
        )
        is None
    )


def test_runtime_info_is_bounded() -> None:
    many = {f"k{i}": i for i in range(MAX_RUNTIME_INFO_ITEMS)}
    with pytest.raises(ClusterSpecError, match=r"nodes\[0\]\.runtime_info: more than"):
        _spec({"node0": many})
    with pytest.raises(ClusterSpecError, match="characters of text"):
        _spec({"node0": {"note": "x" * (1 << 17)}})


def test_kernels_see_their_nodes_runtime_info_in_each_session(sim: mp.Simulator) -> None:
    read = mp.kernel("test.runtime_info")
    with sim:  # the cluster's own spec: each node's entry there
        seen = mp.fetch(mp.device("P1")(read)())
        assert (seen["version"], seen["platform"]) == ("2.5", "tee-sgx")
    own = own_runtime()
    spec = _spec(
        {
            "node2": {"version": "N/A", "platform": own["platform"], "region": "eu-west"},
            "node0": {"version": own["version"], "tier": {"gpu": 2}},
        }
    )
    with mp.connect(sim.address, cluster=spec, driver="ops") as ctx:
        on2 = mp.fetch(mp.device("D2")(read)())
        on0 = mp.fetch(mp.device("D0")(read)())
        assert on2["region"] == "eu-west" and on2["platform"] == own["platform"]
        assert on0["tier"] == {"gpu": 2} and on0["version"] == own["version"]
        rows = [r for r in mp.sessions()["sessions"] if r["session"] == ctx.session]
        assert rows[0]["runtime_info"]["node2"]["region"] == "eu-west"
        assert set(rows[0]["runtime_info"]) == {"node2", "node0"}
        ctx.close()
    with sim:  # the other session still sees the cluster's
        assert mp.fetch(mp.device("P2")(read)())["version"] == "2.5"


def test_a_runtime_a_worker_cannot_serve_refuses_the_open(sim: mp.Simulator) -> None:
    bad = _spec({"node0": {"version": "N/A"}, "node1": {"version": "7.1", "platform": "N/A"}})
    with pytest.raises(ClusterSpecError, match=r"rank 1: runtime_info\.version '7\.1'"):
        mp.connect(sim.address, cluster=bad, driver="picky", session="wants-7")
    # nothing is left open: the name is free, and no session of that driver remains
    declared = _spec({"node0": {"version": "2"}, "node1": {"version": "2.5", "platform": "tee"}})
    with mp.connect(sim.address, cluster=declared, driver="picky", session="wants-7") as ctx:
        assert [r["name"] for r in mp.sessions()["sessions"]] == ["wants-7"]
        assert mp.fetch(mp.device("D1")(lambda: 3)()) == 3
        ctx.close()


mp.pickle_by_value(sys.modules[__name__])


# -- the broker's part, driven without sockets ------------------------------------------------


def _sent(out: list[Any], kind: type) -> list[tuple[bytes, Any]]:
    return [(a.peer, a.msg) for a in out if isinstance(a.msg, kind)]


def test_the_broker_holds_the_open_until_the_named_nodes_accept() -> None:
    from mpl.broker.state import BrokerState
    from mpl.wire.control import Welcome, WorkerHello
    from mpl.wire.remote import ErrorInfo
    from mpl.wire.sessions import (
        Ack,
        OpenSession,
        Reply,
        SessionClosed,
        SessionOpened,
        SessionRuntime,
    )

    def hello(rank: int) -> WorkerHello:
        return WorkerHello(rank, f"inc{rank}", 100 + rank, "host", f"tcp://x:{rank}", "")

    state = BrokerState(ClusterSpec.simple(3, enable_spu=False), now=0.0, broker_id="B")
    state.handle(b"w0", hello(0), 0.0)
    state.handle(b"w2", hello(2), 0.0)  # node1's worker has not joined yet
    spec = _spec({"node1": {"version": "N/A", "zone": "b"}, "node0": {"zone": "a"}}).to_dict()
    out = state.handle(b"drv", OpenSession(7, "", 60.0, "c1", cluster=spec), 0.1)
    assert not _sent(out, SessionOpened)  # held back
    told = _sent(out, SessionRuntime)
    assert [(peer, msg.runtime_info["zone"]) for peer, msg in told] == [(b"w0", "a")]
    sid, bid = told[0][1].session, told[0][1].req
    assert state.handle(b"w2", Ack(bid, 0), 0.2) == []  # another worker cannot answer for 0
    out = state.handle(b"w0", Ack(bid, 0), 0.2)
    assert _sent(out, SessionOpened)[0][1].session == sid
    out = state.handle(b"w1", hello(1), 0.3)  # joining late, it is told on arrival
    assert _sent(out, Welcome)
    late = _sent(out, SessionRuntime)
    assert [(p, m.session, m.req, m.runtime_info["zone"]) for p, m in late] == [
        (b"w1", sid, 0, "b")
    ]
    # a refusal ends the open with the worker's error, and the session is closed everywhere
    out = state.handle(b"drv", OpenSession(8, "x", 60.0, "c1", cluster=spec), 0.4)
    requests = {m.req for _, m in _sent(out, SessionRuntime)}
    assert len(requests) == 1
    bid = requests.pop()
    no = ErrorInfo("ClusterSpecError", "rank 1: runtime_info.version ...", rank=1)
    out = state.handle(b"w1", Ack(bid, 1, no), 0.5)
    assert _sent(out, Reply)[0][1].error.kind == "ClusterSpecError"
    assert {p for p, _ in _sent(out, SessionClosed)} == {b"w0", b"w1", b"w2"}
    assert state.sessions.named("x") is None
    assert state.handle(b"w0", Ack(bid, 0), 0.6) == []  # a late answer changes nothing


def test_a_worker_that_refused_on_joining_late_fails_that_sessions_jobs() -> None:
    from mpl.wire.jobs import Exec
    from mpl.wire.sessions import SessionRuntime
    from mpl.worker.session_runtime import SessionRuntimes

    node = SessionRuntimes(1, lambda: {"version": "2.5", "platform": "tee-sgx"})
    assert node.open(SessionRuntime("s1", 0, {"version": "3", "platform": "N/A"})) is None
    assert node.open(SessionRuntime("s2", 0, {"version": "2", "zone": "b"})) is None
    failed = node.failed(Exec("s1", "j1", "d", (1,), {}))
    assert failed is not None and failed.error.kind == "ClusterSpecError"
    assert "runtime_info.version '3'" in failed.error.message and failed.job == "j1"
    assert node.failed(Exec("s2", "j2", "d", (1,), {})) is None
    assert node.of("s2")["zone"] == "b" and node.of("s1")["version"] == "2.5"
    node.closed("s1")
    assert node.failed(Exec("s1", "j3", "d", (1,), {})) is None


def test_the_version_a_worker_claims_is_the_packages() -> None:
    """``MPL_VERSION`` (what a worker says it runs) is pyproject.toml's version: a release
    that bumps one and not the other fails here."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["version"]
    assert own_runtime()["version"] == MPL_VERSION == declared
