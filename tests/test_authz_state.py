"""Every message is judged by who really sent it: the broker's rules, with explicit ``who``.

``who=None`` is plaintext mode (the routing identity is what the broker goes by); a string
is the identity the ZAP handler stamped on the message in secure mode.
"""

from __future__ import annotations

from typing import Any

import pytest

from mpl.broker.registry import public_incarnation
from mpl.broker.state import BrokerState, Send
from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.codec import decode, encode
from mpl.wire.control import Channel, Heartbeat, Refused, WorkerHello
from mpl.wire.data import Delete, Fetch
from mpl.wire.jobs import Abort, Cancel, Done, Exec, Failed, JobResult, Program
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import (
    Ack,
    CloseSession,
    DeleteSymbol,
    LoadSymbol,
    OpenSession,
    Reply,
    SaveSymbol,
    SessionClosed,
    SessionOpened,
    StatusRequest,
    SymbolInfo,
)
from mpl.worker.state import WorkerState

W0, W1 = b"w0", b"w1"
A, B = b"drv:alice/1", b"drv:bob/1"  # plaintext drivers: the name is in the routing id


def hello(rank: int, inc: str = "") -> WorkerHello:
    return WorkerHello(rank, inc or f"secret{rank}", 100 + rank, "host", f"tcp://x:{rank}", "")


def sent(actions: list[Send], kind: type[Record], peer: bytes | None = None) -> list[Any]:
    return [a.msg for a in actions if isinstance(a.msg, kind) and (peer is None or a.peer == peer)]


def program(tag: int = 1, ranks: tuple[int, ...] = (0, 1)) -> Program:
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=ranks, value=tag)[0]
    g = b.build([v])
    out: Program = wire(Program(g.digest, g))
    return out


def wire(msg: Record, unpickle: bool = False) -> Any:
    """``msg`` as the broker sees it: encoded, then decoded without unpickling."""
    return decode(encode(msg), unpickle=unpickle)


@pytest.fixture
def state() -> BrokerState:
    s = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    s.handle(W0, hello(0), 0.0)
    s.handle(W1, hello(1), 0.0)
    return s


def open_session(
    s: BrokerState, peer: bytes = A, name: str = "", who: str | None = None, **kw: Any
) -> str:
    out = s.handle(peer, OpenSession(1, name, 60.0, peer.decode(), **kw), 0.0, who=who)
    return str(sent(out, SessionOpened, peer)[0].session)


def start_job(
    s: BrokerState, job: str = "j", ranks: tuple[int, ...] = (0, 1), who: str | None = None
) -> str:
    sid = open_session(s, who=who)
    p = program(ranks=ranks)
    s.handle(A, p, 0.0, who=who)
    out = s.handle(A, Exec(sid, job, p.digest, ranks, {}), 0.1, who=who)
    assert sent(out, Exec), out
    return sid


# -- replies count only from the rank they name, for calls sent to that rank -------------------


def test_a_worker_cannot_answer_a_job_for_another_rank(state: BrokerState) -> None:
    sid = start_job(state)
    assert state.handle(W0, Done(sid, "j", 1, {0: "forged"}), 0.2) == []
    assert state.counters["forged_replies"] == 1
    assert state.handle(W0, Done(sid, "j", 0, {0: "a"}), 0.3) == []
    out = state.handle(W1, Done(sid, "j", 1, {0: "b"}), 0.4)
    assert sent(out, JobResult, A)[0].values == {0: {0: "a", 1: "b"}}


def test_a_worker_cannot_answer_a_job_it_was_not_sent(state: BrokerState) -> None:
    sid = start_job(state, ranks=(1,))
    assert state.handle(W0, Done(sid, "j", 0, {0: "forged"}), 0.2) == []
    err = ErrorInfo("RemoteError", "forged failure", rank=0)
    assert state.handle(W0, Failed(sid, "j", 0, err), 0.2) == []
    assert state.handle(W0, Failed(sid, "j", 1, err), 0.2) == []  # names the right rank
    assert "j" in state.calls.jobs
    out = state.handle(W1, Done(sid, "j", 1, {0: 7}), 0.3)
    assert sent(out, JobResult, A)[0].values == {0: {1: 7}}


def test_a_failure_aborts_every_other_rank_whatever_rank_its_error_names(
    state: BrokerState,
) -> None:
    sid = start_job(state)
    err = ErrorInfo("RemoteError", "boom", rank=1)  # the error claims rank 1
    out = state.handle(W0, Failed(sid, "j", 0, err), 0.2)
    assert [a.peer for a in out if isinstance(a.msg, Abort)] == [W1]


def test_fetch_replies_and_acks_count_only_from_the_rank_asked(state: BrokerState) -> None:
    sid = start_job(state)
    out = state.handle(A, Fetch(sid, 5, 1, "j/0"), 0.2)
    bid = sent(out, Fetch, W1)[0].req
    assert state.handle(W0, Reply(bid, value="forged"), 0.3) == []
    out = state.handle(W1, Reply(bid, value="genuine"), 0.3)
    assert sent(out, Reply, A)[0].value == "genuine"
    info = SymbolInfo("x", "P1", (1,), False, {})
    out = state.handle(A, SaveSymbol(sid, 6, "j/0", info), 0.4)
    bid = sent(out, SaveSymbol, W1)[0].req
    assert state.handle(W0, Ack(bid, 1), 0.5) == []  # W0 names rank 1
    assert state.handle(W0, Ack(bid, 0), 0.5) == []  # not asked
    assert state.counters["forged_replies"] == 3
    assert sent(state.handle(W1, Ack(bid, 1), 0.6), Reply, A)


def test_secure_mode_replies_must_come_from_the_ranks_key(state: BrokerState) -> None:
    sid = start_job(state, ranks=(0,), who="driver:alice")
    assert state.handle(W0, Done(sid, "j", 0), 0.2, who="node:node1") == []
    assert state.counters["forged_replies"] == 1
    out = state.handle(W0, Done(sid, "j", 0), 0.3, who="node:node0")
    assert sent(out, JobResult, A)


# -- the incarnation is no credential ------------------------------------------------------------


def test_the_directory_does_not_reveal_incarnations(state: BrokerState) -> None:
    directory = state.registry.directory()
    assert directory.peers[0].incarnation == public_incarnation("secret0") != "secret0"


def test_a_replayed_incarnation_adds_no_channel_and_takes_no_rank(state: BrokerState) -> None:
    sid = start_job(state, ranks=(0,))
    public = state.registry.directory().peers[0].incarnation
    state.handle(b"evil", Channel(0, public), 0.1)  # what every worker saw
    assert state.handle(b"evil", Done(sid, "j", 0, {0: "forged"}), 0.2) == []
    state.handle(W1, Channel(0, "secret0"), 0.2)  # a registered worker's own socket
    assert state.handle(W1, Done(sid, "j", 0, {0: "forged"}), 0.2) == []
    out = state.handle(b"evil2", hello(0, public), 0.3)
    assert sent(out, Refused, b"evil2") and state.registry.by_rank[0].peer == W0
    state.handle(b"evil3", Channel(0, "secret0"), 0.3, who="node:node1")  # wrong key
    assert state.handle(b"evil3", Done(sid, "j", 0), 0.3, who="node:node1") == []
    state.handle(b"chan0", Channel(0, "secret0"), 0.4)
    assert sent(state.handle(b"chan0", Done(sid, "j", 0, {0: 1}), 0.5), JobResult, A)


def test_a_worker_that_says_hello_twice_keeps_its_result_channel(state: BrokerState) -> None:
    # Under load a worker may repeat its hello before the first Welcome arrives; it then
    # announces its channel once per Welcome. Its results must still count.
    sid = start_job(state, ranks=(0,))
    state.handle(b"chan0", Channel(0, "secret0"), 0.1)
    state.handle(W0, hello(0), 0.2)  # the same process again (same incarnation)
    state.handle(b"chan0", Channel(0, "secret0"), 0.3)  # the Channel after the 2nd Welcome
    assert "ignored a channel" not in " ".join(state.errors)
    assert sent(state.handle(b"chan0", Done(sid, "j", 0, {0: 1}), 0.4), JobResult, A)


# -- sessions belong to drivers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("alice", "bob", "who_a", "who_b"),
    [(A, B, None, None), (b"a1", b"b1", "driver:alice", "driver:bob")],
    ids=["plaintext", "secure"],
)
def test_another_driver_can_do_nothing_in_a_session(
    state: BrokerState, alice: bytes, bob: bytes, who_a: str | None, who_b: str | None
) -> None:
    sid = open_session(state, alice, "mine", who=who_a)
    p = program()
    state.handle(alice, p, 0.0, who=who_a)
    state.handle(bob, p, 0.0, who=who_b)
    out = state.handle(alice, Exec(sid, "j", p.digest, (0, 1), {}), 0.1, who=who_a)
    assert sent(out, Exec, W0)

    def refused(msg: Record) -> None:
        out = state.handle(bob, msg, 0.2, who=who_b)
        answers = sent(out, Reply, bob) + sent(out, JobResult, bob)
        assert len(answers) == 1 and answers[0].error.kind == "SessionAccessError", out
        assert "bob" in answers[0].error.message and sid in answers[0].error.message
        assert not [a for a in out if a.peer in (W0, W1)]

    refused(OpenSession(3, "mine", 60.0, "bob"))
    refused(Exec(sid, "j2", p.digest, (0, 1), {}))
    refused(Fetch(sid, 4, 0, "j/0"))
    refused(SaveSymbol(sid, 5, "j/0", SymbolInfo("n", "P0", (0,), False, {})))
    refused(LoadSymbol(sid, 6, "n"))
    refused(DeleteSymbol(sid, 7, "n"))
    for silent in (Delete(sid, {0: ["j/0"]}), Cancel(sid, "j", "x"), CloseSession(sid, "bob")):
        assert state.handle(bob, silent, 0.3, who=who_b) == []
    state.handle(bob, CloseSession(sid, alice.decode()), 0.3, who=who_b)  # names alice's client
    assert sid in state.sessions.by_id and "j" in state.calls.jobs
    state.handle(bob, Heartbeat(sessions=[sid]), 50.0, who=who_b)
    assert state.sessions.by_id[sid].last_seen < 50.0  # bob's heartbeat keeps no lease alive
    assert state.counters["refused_requests"] >= 6


def test_the_owner_shares_a_session_and_only_the_owner_may(state: BrokerState) -> None:
    sid = open_session(state, A, "s", share_with=["bob"])
    assert open_session(state, B, "s") == sid
    out = state.handle(b"drv:carol/1", OpenSession(2, "s", 60.0, "c"), 0.1)
    assert sent(out, Reply)[0].error.kind == "SessionAccessError"
    out = state.handle(B, OpenSession(3, "s", 60.0, "b", ["carol"]), 0.1)  # bob may not share
    assert "only its owner" in sent(out, Reply, B)[0].error.message
    out = state.handle(A, OpenSession(4, "s", 60.0, "a", []), 0.2)  # the owner unshares
    assert sent(out, SessionOpened, A)
    out = state.handle(B, Fetch(sid, 5, 0, "x"), 0.3)
    assert sent(out, Reply, B)[0].error.kind == "SessionAccessError"
    out = state.handle(A, OpenSession(5, "s", 60.0, "a", ["not a name!"]), 0.2)
    assert "bad driver name" in sent(out, Reply, A)[0].error.message


def test_a_shared_driver_may_close_and_run(state: BrokerState) -> None:
    sid = open_session(state, A, "s", share_with=["bob"])
    open_session(state, B, "s")
    p = program()
    state.handle(B, p, 0.0)
    assert sent(state.handle(B, Exec(sid, "j", p.digest, (0, 1), {}), 0.1), Exec)
    state.handle(A, CloseSession(sid, "drv:alice/1"), 0.2)
    out = state.handle(B, CloseSession(sid, "drv:bob/1"), 0.2)
    assert sent(out, SessionClosed)


def test_persisted_values_are_read_only_through_a_load(state: BrokerState) -> None:
    state.persisted.saved(SymbolInfo("secret", "P1", (1,), True, {}), (1,))
    sid = open_session(state)
    out = state.handle(A, Fetch(sid, 1, 1, "sym:secret"), 0.1)
    error = sent(out, Reply, A)[0].error
    assert error.kind == "SessionAccessError" and "mp.load('secret')" in error.message
    p = program()
    state.handle(A, p, 0.1)
    out = state.handle(A, Exec(sid, "j", p.digest, (0, 1), {1: ["sym:secret"]}), 0.1)
    assert sent(out, JobResult, A)[0].error.kind == "SessionAccessError"
    info = SymbolInfo("copy", "P1", (1,), False, {})
    out = state.handle(A, SaveSymbol(sid, 2, "sym:secret", info), 0.1)
    assert sent(out, Reply, A)[0].error.kind == "SessionAccessError"
    out = state.handle(A, DeleteSymbol(sid, 3, "secret"), 0.1)
    assert sent(out, Reply, A)[0].error.kind == "SessionAccessError"
    assert not [a for a in out if a.peer in (W0, W1)] and "secret" in state.persisted
    assert sent(state.handle(A, LoadSymbol(sid, 4, "secret"), 0.2), Reply, A)[0].error is None
    assert sent(state.handle(A, Fetch(sid, 5, 1, "sym:secret"), 0.3), Fetch, W1)
    other = open_session(state)  # a load counts in its own session only
    out = state.handle(A, Fetch(other, 6, 1, "sym:secret"), 0.3)
    assert sent(out, Reply, A)[0].error.kind == "SessionAccessError"


# -- programs are cached per driver and checked against their digest --------------------------


def test_a_driver_cannot_replace_another_drivers_program(state: BrokerState) -> None:
    sid_a = open_session(state, A)
    sid_b = open_session(state, B)
    genuine, other = program(1), program(2)
    state.handle(A, genuine, 0.0)
    forged = wire(Program(genuine.digest, other.graph))
    out = state.handle(B, forged, 0.1)
    assert "digest" in sent(out, Refused, B)[0].error.message
    out = state.handle(B, Exec(sid_b, "jb", genuine.digest, (0, 1), {}), 0.2)
    assert sent(out, JobResult, B)[0].missing_program  # bob's cache is his own
    out = state.handle(A, Exec(sid_a, "ja", genuine.digest, (0, 1), {}), 0.3)
    shipped = sent(out, Program, W0)[0]
    assert shipped is genuine


def test_a_worker_caches_a_program_only_under_its_own_digest() -> None:
    core = WorkerState(hello(0), now=0.0)
    genuine, other = program(1), program(2)
    forged = wire(Program(genuine.digest, other.graph), unpickle=True)
    core.handle(forged, 0.0)
    assert core.program(genuine.digest) is None and core.refused_programs == 1
    assert "ProtocolError" in core.broken[genuine.digest]
    core.handle(wire(genuine, unpickle=True), 0.1)
    assert core.program(genuine.digest) is not None and genuine.digest not in core.broken
    core.handle(forged, 0.2)  # a forgery does not displace the genuine copy
    kept = core.program(genuine.digest)
    assert kept is not None and kept.graph is not None and kept.graph.digest == genuine.digest


# -- status -------------------------------------------------------------------------------------


def test_status_in_secure_mode_shows_others_sessions_only_as_counts(state: BrokerState) -> None:
    open_session(state, b"a1", "alices", who="driver:alice")
    open_session(state, b"b1", "bobs", who="driver:bob")
    out = state.handle(b"b1", StatusRequest(9), 0.1, who="driver:bob")
    status = sent(out, Reply)[0].value
    assert [s["name"] for s in status["sessions"]] == ["bobs"]
    assert status["other_sessions"] == 1 and status["errors"] == []
    out = state.handle(b"n1", StatusRequest(9), 0.1, who="node:node1")
    assert sent(out, Reply)[0].error.kind == "AuthenticationError"
    full = sent(state.handle(b"op", StatusRequest(1), 0.1), Reply)[0].value  # plaintext
    assert {s["name"] for s in full["sessions"]} == {"alices", "bobs"}


def test_node_identities_may_not_act_as_drivers(state: BrokerState) -> None:
    out = state.handle(b"n1", OpenSession(1, "", 60.0, "x"), 0.0, who="node:node1")
    assert sent(out, Refused)[0].error.kind == "AuthenticationError"
    assert not state.sessions.by_id


def test_plaintext_identity_is_the_declared_name() -> None:
    from mpl.wire.routing import driver_routing_id, plaintext_identity

    rid = driver_routing_id("alice")
    assert plaintext_identity(rid) == "driver:alice" and rid != driver_routing_id("alice")
    assert plaintext_identity(b"\x00k\x8b").startswith("driver:~")
    assert plaintext_identity(b"drv:bad name/1").startswith("driver:~")


def test_one_driver_cannot_fill_the_session_table(state: BrokerState) -> None:
    from mpl.broker.access import MAX_OWNED

    for _ in range(MAX_OWNED):
        open_session(state, A)
    out = state.handle(A, OpenSession(9, "", 60.0, "a"), 0.1)
    assert "close some first" in sent(out, Reply, A)[0].error.message
    assert open_session(state, B)  # another driver is not affected
    assert len(state.sessions.by_id) == MAX_OWNED + 1


def test_one_session_takes_a_bounded_number_of_clients(state: BrokerState) -> None:
    from mpl.broker.access import MAX_CLIENTS

    open_session(state, A, "s")
    for i in range(MAX_CLIENTS - 1):
        state.handle(A, OpenSession(2, "s", 60.0, f"client{i}"), 0.1)
    out = state.handle(A, OpenSession(3, "s", 60.0, "one-too-many"), 0.1)
    assert "clients attached" in sent(out, Reply, A)[0].error.message
    assert sent(state.handle(A, OpenSession(4, "s", 60.0, "client0"), 0.1), SessionOpened)
