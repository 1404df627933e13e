"""The broker's decision logic, driven by messages and explicit timestamps: no sockets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mpl.broker.state import BrokerState, Send
from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.control import (
    Channel,
    Directory,
    Heartbeat,
    Refused,
    Reregister,
    Welcome,
    WorkerHello,
)
from mpl.wire.jobs import Abort, Done, Exec, Failed, JobResult, Lit, Program
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import (
    CloseSession,
    OpenSession,
    Reply,
    SessionClosed,
    SessionOpened,
    StatusRequest,
)

W0, W1, D = b"w0", b"w1", b"drv"


def hello(rank: int, inc: str = "") -> WorkerHello:
    return WorkerHello(rank, inc or f"inc{rank}", 100 + rank, "host", f"tcp://x:{rank}", "")


def sent(actions: list[Send], kind: type[Record], peer: bytes | None = None) -> list[Any]:
    return [a.msg for a in actions if isinstance(a.msg, kind) and (peer is None or a.peer == peer)]


@pytest.fixture
def state() -> BrokerState:
    s = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    s.handle(W0, hello(0), 0.0)
    s.handle(W1, hello(1), 0.0)
    return s


def open_session(s: BrokerState, now: float = 0.0, lease: float = 60.0, name: str = "") -> str:
    out = s.handle(D, OpenSession(1, name, lease, "c1"), now)
    opened = sent(out, SessionOpened, D)[0]
    return str(opened.session)


def program(world: int = 2, ranks: tuple[int, ...] = (0, 1)) -> Program:
    b = GraphBuilder(world)
    v = b.op("pcall", [], ranks=ranks, fn=b.fn(abs))[0]
    g = b.build([v])
    return Program(g.digest, g)


def test_registration_welcome_directory_and_refusals() -> None:
    s = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    out = s.handle(W0, hello(0), 0.0)
    assert sent(out, Welcome, W0)[0].rank == 0
    assert list(sent(out, Directory, W0)[0].peers) == [0]
    out = s.handle(b"dup", hello(0, "other"), 0.1)
    assert "already served" in sent(out, Refused, b"dup")[0].error.message
    out = s.handle(b"far", hello(5), 0.1)
    assert "outside this cluster" in sent(out, Refused, b"far")[0].error.message
    # the same process re-registering from a new socket replaces its entry
    out = s.handle(b"w0b", hello(0), 0.2)
    assert sent(out, Welcome, b"w0b")
    assert s.registry.by_rank[0].peer == b"w0b"


def test_silent_worker_is_lost_after_3_heartbeats(state: BrokerState) -> None:
    state.handle(W0, Heartbeat({"objects": 3}, rank=0), 2.5)
    state.tick(2.9)
    assert set(state.registry.by_rank) == {0, 1}
    out = state.tick(3.1)  # rank 1 silent since 0.0
    assert set(state.registry.by_rank) == {0}
    assert sent(out, Directory, W0)[0].peers.keys() == {0}
    assert state.status(3.1)["ranks"][1]["state"] == "lost"
    assert state.status(3.1)["ranks"][0]["objects"] == 3


def test_exec_fans_out_and_answers_once(state: BrokerState) -> None:
    sid = open_session(state)
    p = program()
    state.handle(D, p, 0.0)
    out = state.handle(D, Exec(sid, "j1", p.digest, (0, 1), {}), 0.1, raw="RAW")
    assert len(sent(out, Program)) == 2  # first use on each worker
    execs = [a for a in out if isinstance(a.msg, Exec)]
    assert {a.peer for a in execs} == {W0, W1} and all(a.raw == "RAW" for a in execs)
    assert state.handle(W0, Done(sid, "j1", 0, {0: 5}), 0.2) == []
    out = state.handle(W1, Done(sid, "j1", 1, {0: 6}), 0.3)
    result = sent(out, JobResult, D)[0]
    assert result.values == {0: {0: 5, 1: 6}} and result.error is None
    # a second run of the same program sends no Program
    out = state.handle(D, Exec(sid, "j2", p.digest, (0, 1), {}), 0.4)
    assert not sent(out, Program)


def test_each_rank_sees_only_its_own_bindings(state: BrokerState) -> None:
    sid = open_session(state)
    p = program()
    state.handle(D, p, 0.0)
    bindings = {0: [Lit(np.ones(2))], 1: [Lit("secret of 1")]}
    out = state.handle(D, Exec(sid, "j", p.digest, (0, 1), bindings), 0.1, raw="RAW")
    for a in out:
        if isinstance(a.msg, Exec):
            assert a.raw is None  # re-encoded, not forwarded whole
            rank = 0 if a.peer == W0 else 1
            assert set(a.msg.bindings) == {rank}


def test_first_failure_answers_and_aborts_the_other_ranks(state: BrokerState) -> None:
    sid = open_session(state)
    p = program()
    state.handle(D, p, 0.0)
    state.handle(D, Exec(sid, "j", p.digest, (0, 1), {}), 0.1)
    err = ErrorInfo("RemoteError", "boom", rank=0, op="0 (pcall f)", remote_type="ValueError")
    out = state.handle(W0, Failed(sid, "j", 0, err), 0.2)
    assert sent(out, JobResult, D)[0].error == err
    assert [a.peer for a in out if isinstance(a.msg, Abort)] == [W1]
    assert state.handle(W1, Done(sid, "j", 1), 0.3) == []  # late answers are dropped
    assert state.counters["jobs_failed"] == 1


def test_losing_a_rank_fails_its_jobs_and_releases_the_others(state: BrokerState) -> None:
    sid = open_session(state)
    p = program()
    state.handle(D, p, 0.0)
    state.handle(D, Exec(sid, "j", p.digest, (0, 1), {}), 0.1)
    out = state.disconnected(W0, 0.2)
    error = sent(out, JobResult, D)[0].error
    assert error.kind == "WorkerLostError" and error.rank == 0
    assert [a.peer for a in out if isinstance(a.msg, Abort)] == [W1]
    out = state.handle(D, Exec(sid, "j2", p.digest, (0, 1), {}), 0.3)
    assert "no live worker" in sent(out, JobResult, D)[0].error.message


def test_missing_program_and_unknown_session(state: BrokerState) -> None:
    sid = open_session(state)
    out = state.handle(D, Exec(sid, "j", "nodigest", (0,), {}), 0.1)
    assert sent(out, JobResult, D)[0].missing_program
    out = state.handle(D, Exec("nope", "j", "nodigest", (0,), {}), 0.1)
    assert "unknown session" in sent(out, JobResult, D)[0].error.message


def test_lease_expiry_and_close_tell_every_worker(state: BrokerState) -> None:
    sid = open_session(state, lease=1.0)
    state.handle(D, Heartbeat(sessions=[sid]), 0.9)  # a driver heartbeat renews the lease
    assert not sent(state.tick(1.5), SessionClosed)
    out = state.tick(2.0)
    assert {a.peer for a in out if isinstance(a.msg, SessionClosed)} == {W0, W1}
    other = open_session(state, now=2.0, name="n")
    state.handle(D, OpenSession(3, "n", 60.0, "c1", ["c2"]), 2.0)  # the owner shares it
    state.handle(b"drv:c2/1", OpenSession(2, "n", 60.0, "c2"), 2.0)
    assert not sent(state.handle(D, CloseSession(other, "c1"), 2.1), SessionClosed)
    assert sent(state.handle(D, CloseSession(other, "c2"), 2.2), SessionClosed)


def test_unknown_peers_are_told_to_reregister(state: BrokerState) -> None:
    out = state.handle(b"stranger", Heartbeat(rank=1), 0.0)
    assert sent(out, Reregister)
    out = state.handle(b"old-driver", Heartbeat(sessions=["gone"]), 0.0)
    assert sent(out, Reregister)


def test_result_channels_count_as_their_worker(state: BrokerState) -> None:
    sid = open_session(state)
    p = program(ranks=(0,))
    state.handle(D, p, 0.0)
    state.handle(D, Exec(sid, "j", p.digest, (0,), {}), 0.0)
    assert state.handle(b"chan0", Channel(0, "wrong-incarnation"), 0.0) == []
    assert state.handle(b"chan0", Done(sid, "j", 0), 0.1) == []  # not a channel: dropped
    state.handle(b"chan0", Channel(0, "inc0"), 0.1)
    assert sent(state.handle(b"chan0", Done(sid, "j", 0), 0.2), JobResult, D)


def test_workers_may_not_send_driver_messages_and_status_works(state: BrokerState) -> None:
    out = state.handle(W0, OpenSession(1, "", 1.0, "x"), 0.0)
    assert "a worker may not send" in sent(out, Refused, W0)[0].error.message
    out = state.handle(D, StatusRequest(7), 0.0)
    reply = sent(out, Reply, D)[0]
    assert reply.req == 7 and reply.value["world_size"] == 2
