"""Attacks from raw ZeroMQ sockets against real daemons (plaintext, loopback).

In plaintext mode the routing identity is what the broker can rely on; every attack here
works with that alone. After each one the daemons still serve, and nothing changed.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import nap_then, stats, wait_until

from mpl.wire import GraphBuilder
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.control import Channel, Directory, Refused, Welcome, WorkerHello
from mpl.wire.data import Fetch, Move
from mpl.wire.errors import SessionAccessError
from mpl.wire.jobs import Done, Exec, Failed, JobResult, Program, output_uri
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import Ack, OpenSession, Reply, SessionOpened, SymbolInfo

pytestmark = pytest.mark.daemons


class Raw:
    """A raw DEALER on the broker, speaking the wire by hand."""

    def __init__(self, ctx: zmq.Context[Any], address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, msg: Record) -> None:
        self.sock.send_multipart(to_wire(encode(msg)))

    def wait_for(self, match: Any, timeout: float = 10.0) -> Record:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.sock.poll(int(left * 1000) + 1):
                msg = decode(from_wire(self.sock.recv_multipart()), unpickle=False)
                if match(msg):
                    return msg
        raise AssertionError("no matching answer in time")

    def open_session(self, name: str) -> str:
        """Open a session of ``name`` as a driver does; returns its id."""
        self.send(OpenSession(1, "", 60.0, name))
        opened = self.wait_for(lambda m: isinstance(m, SessionOpened))
        assert isinstance(opened, SessionOpened)
        return opened.session


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    """A context for raw sockets; every socket made on it is closed at the end."""
    ctx: zmq.Context[Any] = zmq.Context()
    made: list[zmq.Socket[Any]] = []
    socket = ctx.socket

    def tracked(kind: int) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = socket(kind)
        made.append(sock)
        return sock

    ctx.socket = tracked  # type: ignore[method-assign,assignment]  # tracks every socket
    yield ctx
    for sock in made:
        sock.close(linger=0)
    ctx.term()


def impostor(cluster: Any, zctx: zmq.Context[Any], rank: int) -> tuple[Raw, Directory]:
    """Replace the real worker of ``rank`` by a raw socket registered in its place."""
    # Connect first: a connection made right after the worker's closes may reuse its file
    # descriptor, which the broker's shell can mistake for the old one closing.
    raw = Raw(zctx, cluster.address)
    cluster.impl.kill_worker(rank, signal.SIGTERM)
    wait_until(lambda: stats(cluster.clients[0], rank)["state"] != "up", what="rank to go")
    raw.send(WorkerHello(rank, "attacker", 1, "evil", "tcp://127.0.0.1:9", ""))
    raw.wait_for(lambda m: isinstance(m, Welcome))
    directory = raw.wait_for(lambda m: isinstance(m, Directory) and len(m.peers) == 3)
    assert isinstance(directory, Directory)
    return raw, directory


def test_a_registered_worker_cannot_answer_for_another_rank(make_cluster: Any, zctx: Any) -> None:
    cluster = make_cluster("tcp", world_size=3)
    watcher = cluster.client()
    attacker, directory = impostor(cluster, zctx, 2)
    victim = Raw(zctx, cluster.address)
    sid = victim.open_session("victim")
    b = GraphBuilder(3)
    a = b.op("constant", [], ranks=(0,), value=np.arange(3))[0]
    slow = b.op("pcall", [], ranks=(1,), fn=b.fn(nap_then), args=("genuine", 1.0))[0]
    graph = b.build([a, slow])
    victim.send(Program(graph.digest, graph))
    victim.send(Exec(sid, "victim-job", graph.digest, (0, 1), {}, (0, 1)))
    victim.send(Fetch(sid, 7, 1, output_uri("victim-job", 1)))  # queued behind the job
    # the forgeries must reach the broker while the job waits for rank 1's genuine answer
    wait_until(lambda: watcher.status()["jobs_in_flight"] == 1, what="the job to be running")
    public = directory.peers[1].incarnation
    channel = Raw(zctx, cluster.address)
    channel.send(Channel(1, public))  # the incarnation every worker sees
    forged = ErrorInfo("RemoteError", "forged failure", rank=1)
    for sock in (attacker, channel):
        sock.send(Done(sid, "victim-job", 1, {1: "forged"}))
        sock.send(Failed(sid, "victim-job", 1, forged))
        for bid in range(1, 40):  # broker request numbers are small: guess them all
            sock.send(Reply(bid, value="forged"))
            sock.send(Ack(bid, 1))
    attacker.send(Done(sid, "victim-job", 2, {1: "forged"}))
    result = victim.wait_for(lambda m: isinstance(m, JobResult))
    assert isinstance(result, JobResult) and result.error is None
    assert result.values[1] == {1: "genuine"}
    reply = victim.wait_for(lambda m: isinstance(m, Reply) and m.req == 7)
    assert isinstance(reply, Reply) and reply.error is None
    status = watcher.status()
    assert status["forged_replies"] >= 41, status["errors"][-3:]  # 39 acks, a done, a failed
    assert [r["state"] for r in status["ranks"]] == ["up", "up", "up"]


def test_a_replayed_incarnation_cannot_take_a_rank(make_cluster: Any, zctx: Any) -> None:
    cluster = make_cluster("tcp", world_size=3)
    watcher = cluster.client()
    _attacker, directory = impostor(cluster, zctx, 2)
    before = watcher.status()["ranks"][0]
    thief = Raw(zctx, cluster.address)
    thief.send(WorkerHello(0, directory.peers[0].incarnation, 2, "evil", "tcp://x:1", ""))
    refused = thief.wait_for(lambda m: isinstance(m, Refused))
    assert isinstance(refused, Refused) and "already served" in refused.error.message
    after = watcher.status()["ranks"][0]
    assert (after["pid"], after["host"]) == (before["pid"], before["host"])
    sid = watcher.open_session().session
    b = GraphBuilder(3)
    g = b.build([b.op("constant", [], ranks=(0,), value=5)[0]])
    assert watcher.submit(sid, g, {}, inline=(0,)).values[0] == {0: 5}


def test_another_driver_cannot_use_a_session(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    owner, intruder = cluster.client(), cluster.client()
    sid = owner.open_session("private").session
    b = GraphBuilder(2)
    g = b.build([b.op("constant", [], ranks=(1,), value=[4, 2])[0]])
    job = owner.submit(sid, g, {}).job
    with pytest.raises(SessionAccessError, match="private"):
        intruder.open_session("private")
    with pytest.raises(SessionAccessError, match=sid):
        intruder.submit(sid, g, {})
    with pytest.raises(SessionAccessError, match=sid):
        intruder.fetch(sid, 1, output_uri(job, 0))
    intruder.close_session(sid)  # no answer, and no effect
    intruder.sessions.discard(sid)
    assert owner.fetch(sid, 1, output_uri(job, 0)) == [4, 2]
    assert {s["name"] for s in owner.status()["sessions"]} == {"private"}
    auditor = cluster.client(driver="auditor")
    owner.open_session("private", share_with=["auditor"])
    assert auditor.open_session("private").session == sid
    assert auditor.fetch(sid, 1, output_uri(job, 0)) == [4, 2]


def test_a_program_under_another_drivers_digest_replaces_nothing(
    make_cluster: Any, zctx: Any
) -> None:
    cluster = make_cluster("tcp")
    owner = cluster.client()
    sid = owner.open_session().session
    b = GraphBuilder(2)
    genuine = b.build([b.op("constant", [], ranks=(0,), value="genuine")[0]])
    assert owner.submit(sid, genuine, {}, inline=(0,)).values[0] == {0: "genuine"}
    b2 = GraphBuilder(2)
    other = b2.build([b2.op("constant", [], ranks=(0,), value="forged")[0]])
    attacker = Raw(zctx, cluster.address)
    attacker.send(Program(genuine.digest, other))
    refused = attacker.wait_for(lambda m: isinstance(m, Refused))
    assert isinstance(refused, Refused) and "digest" in refused.error.message
    assert owner.submit(sid, genuine, {}, inline=(0,)).values[0] == {0: "genuine"}
    assert owner.status()["protocol_errors"] == 1


def test_a_persisted_value_is_fetched_only_after_a_load(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    owner, reader = cluster.client(), cluster.client()
    sid = owner.open_session().session
    b = GraphBuilder(2)
    g = b.build([b.op("constant", [], ranks=(1,), value=[1, 2, 3])[0]])
    job = owner.submit(sid, g, {}).job
    owner.save_symbol(sid, output_uri(job, 0), SymbolInfo("model", "P1", (1,), True, {}))
    mine = reader.open_session().session
    with pytest.raises(SessionAccessError, match=r"mp\.load"):
        reader.fetch(mine, 1, "sym:model")
    b2 = GraphBuilder(2)
    a = b2.input((1,))
    leak = b2.build([b2.op("pcall", [a], ranks=(1,), fn=b2.fn(len))[0]])
    with pytest.raises(SessionAccessError):
        reader.submit(mine, leak, {1: ["sym:model"]})
    reader.load_symbol(mine, "model")
    assert reader.fetch(mine, 1, "sym:model") == [1, 2, 3]
    assert reader.submit(mine, leak, {1: ["sym:model"]}, inline=(0,)).values[0] == {1: 3}


def test_moves_for_unknown_jobs_stay_within_the_bound(make_cluster: Any, zctx: Any) -> None:
    cluster = make_cluster("tcp", world_size=3)
    watcher = cluster.client()
    _attacker, directory = impostor(cluster, zctx, 2)
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(directory.peers[1].data_addr)
    for i in range(3000):
        push.send_multipart(
            to_wire(encode(Move("s", f"guess{i}", 0, 0, 0, 1, b"x" * 100))), copy=False
        )
    wait_until(
        lambda: stats(watcher, 1).get("moves_dropped", 0) >= 3000 - 1024,
        what="rank 1 to count the dropped moves",
    )
    row = stats(watcher, 1)
    assert row["moves_held"] <= 1024 and row["moves_pending"] == 0
    sid = watcher.open_session().session
    b = GraphBuilder(3)
    x = b.op("constant", [], ranks=(0,), value=np.arange(4.0))[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
    g = b.build([y])
    assert watcher.submit(sid, g, {}, inline=(0,)).values[0][1].tolist() == [0, 1, 2, 3]


def test_job_ids_are_random_not_a_counter(make_cluster: Any) -> None:
    cluster = make_cluster("inproc")
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    g = b.build([b.op("constant", [], ranks=(0,), value=1)[0]])
    ids = [client.submit(sid, g, {}).job for _ in range(3)]
    assert len(set(ids)) == 3
    for job in ids:
        assert len(job) == 24 and int(job, 16) >= 0  # 96 random bits, nothing derived
        assert client.client_id not in job
