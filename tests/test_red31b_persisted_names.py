"""Second red team w31, finding B5 (fixed): a secure broker listed every persisted name, with
its parties, device and description, to every listed driver.

``mp.symbols()`` (a ``ListRequest`` of ``symbols``) and a driver's ``status``
(``persisted_symbols``) listed the whole table of persisted names (``broker/listing.py``,
``broker/status_view.py``): any listed driver, one that shares no session with the owner
too, learnt what the others persisted, where, and its ``float64[3]``-style description.

Now the broker keeps an owner per entry (``broker/persisted.py``): for a save it saw done,
the authenticated driver that sent the job; for what a worker's hello lists after a broker
restart, the owner that worker wrote into the file, kept only when it names a driver of the
spec. A value several ranks hold is listed to its owner only when they all name it. In
plaintext nobody is authenticated: every driver lists every name, as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zmq

from mpl.broker.state import BrokerState, Send
from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.codec import decode, encode
from mpl.wire.control import Welcome, WorkerHello
from mpl.wire.jobs import Done, Exec, Failed, JobResult, Program
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import (
    DeleteSymbol,
    ListRequest,
    LoadSymbol,
    OpenSession,
    Reply,
    SessionOpened,
    StatusRequest,
    SymbolInfo,
)
from mpl.worker.symbol_disk import SymbolDisk

ALICE, BOB, MALLORY = "driver:alice", "driver:bob", "driver:mallory"
W = [b"w0", b"w1", b"w2"]


def _z85() -> str:
    return zmq.curve_keypair()[0].decode()


def _spec(world: int = 3) -> ClusterSpec:
    drivers = {"alice": _z85(), "bob": _z85()}  # mallory is no driver of this spec
    return ClusterSpec.simple(world, enable_spu=False).with_keys(
        _z85(), [_z85() for _ in range(world)], drivers
    )


def _hello(rank: int, symbols: list[SymbolInfo], owners: dict[str, str]) -> WorkerHello:
    return WorkerHello(rank, f"inc{rank}", 1, "h", f"tcp://x:{rank}", "", symbols, "", owners)


def _secure(owners: dict[int, dict[str, str]] | None = None, **symbols: Any) -> BrokerState:
    """A secure broker whose workers registered (with ``symbols[f"r{rank}"]`` on their
    disks and ``owners[rank]`` as their owners)."""
    state = BrokerState(_spec(), now=0.0, broker_id="B", secure=True)
    for rank in range(3):
        hello = _hello(rank, symbols.get(f"r{rank}", []), (owners or {}).get(rank, {}))
        out = state.handle(W[rank], hello, 0.0, who=f"node:node{rank}")
        assert isinstance(out[0].msg, Welcome)
    return state


def _reply(actions: list[Send], peer: bytes) -> Reply:
    (reply,) = [a.msg for a in actions if a.peer == peer and isinstance(a.msg, Reply)]
    assert isinstance(reply, Reply)
    return reply


def _listed(state: BrokerState, who: str | None) -> list[tuple[str, int]]:
    peer = (who or "drv:plain/1").encode()
    reply = _reply(state.handle(peer, ListRequest(1, "symbols", ""), 0.5, who=who), peer)
    return [(row["name"], row["rank"]) for row in reply.value["persisted"]]


def _status_names(state: BrokerState, who: str | None) -> list[str]:
    peer = (who or "drv:plain/1").encode()
    reply = _reply(state.handle(peer, StatusRequest(1), 0.5, who=who), peer)
    names: list[str] = reply.value["persisted_symbols"]
    return names


def _desc(name: str, device: str, ranks: tuple[int, ...]) -> SymbolInfo:
    return SymbolInfo(name, device, ranks, True, {"meta": "float64[3]"})


def _alice_saves(state: BrokerState, name: str) -> str:
    """Alice's job on rank 0 whose Done reports persisting ``name``; her session's id."""
    peer = ALICE.encode()
    opened = state.handle(peer, OpenSession(1, "", 60.0, "c"), 0.1, who=ALICE)
    sid = next(a.msg.session for a in opened if isinstance(a.msg, SessionOpened))
    b = GraphBuilder(3)
    b.op("constant", [], ranks=(0,), value=1)
    graph = b.build([])
    program = decode(encode(Program(graph.digest, graph)), unpickle=False)
    assert isinstance(program, Program)
    state.handle(peer, program, 0.1, who=ALICE)
    out = state.handle(peer, Exec(sid, "j", program.digest, (0,), {}), 0.2, who=ALICE)
    assert any(isinstance(a.msg, Exec) for a in out), out
    done = Done(sid, "j", 0, saved=[_desc(name, "P0", (0,))])
    out = state.handle(W[0], done, 0.3, who="node:node0")
    assert [a.msg.error for a in out if isinstance(a.msg, JobResult)] == [None]
    return sid


def test_a_driver_does_not_list_another_drivers_persisted_names() -> None:
    state = _secure()
    _alice_saves(state, "payroll_cuts")
    assert _listed(state, BOB) == [] and _status_names(state, BOB) == []
    assert _listed(state, ALICE) == [("payroll_cuts", 0)]
    assert _status_names(state, ALICE) == ["payroll_cuts"]
    # nor does a load of a name bob has not got list the others' names
    peer = BOB.encode()
    opened = state.handle(peer, OpenSession(1, "", 60.0, "c"), 0.4, who=BOB)
    sid = next(a.msg.session for a in opened if isinstance(a.msg, SessionOpened))
    error = _reply(state.handle(peer, LoadSymbol(sid, 2, "nothing"), 0.5, who=BOB), peer).error
    assert error is not None and "payroll_cuts" not in error.message


def test_a_name_the_broker_learnt_without_its_owner_is_listed_to_no_one() -> None:
    state = _secure()
    state.persisted.saved(_desc("payroll_cuts", "P0", (0,)), (0,))  # no owner known
    assert _listed(state, ALICE) == _listed(state, BOB) == []


def test_after_a_restart_each_name_is_listed_to_the_owner_its_files_name() -> None:
    spu = _desc("shares", "SP0", (0, 1))
    state = _secure(
        owners={0: {"shares": ALICE, "own": BOB}, 1: {"shares": ALICE}},
        r0=[spu, _desc("own", "P0", (0,))],
        r1=[spu],
    )
    assert _listed(state, ALICE) == [("shares", 0), ("shares", 1)]
    assert _listed(state, BOB) == [("own", 0)]
    assert _status_names(state, BOB) == ["own"]


def test_a_value_whose_ranks_name_different_owners_is_listed_to_no_one() -> None:
    spu = _desc("shares", "SP0", (0, 1))
    # rank 1 says the shares are bob's: neither rank alone decides whose the value is
    state = _secure(owners={0: {"shares": ALICE}, 1: {"shares": BOB}}, r0=[spu], r1=[spu])
    assert _listed(state, ALICE) == _listed(state, BOB) == []
    # one rank without an owner for it (a file from before owners) also makes it no one's
    state = _secure(owners={0: {"shares": ALICE}}, r0=[spu], r1=[spu])
    assert _listed(state, ALICE) == []


def test_two_parties_values_under_one_name_are_each_listed_to_their_own_owner() -> None:
    state = _secure(
        owners={0: {"model": ALICE}, 2: {"model": BOB}},
        r0=[_desc("model", "P0", (0,))],
        r2=[_desc("model", "P2", (2,))],
    )
    assert _listed(state, ALICE) == [("model", 0)]
    assert _listed(state, BOB) == [("model", 2)]


def test_a_hello_names_as_owner_only_a_driver_of_the_spec() -> None:
    state = _secure(owners={0: {"x": MALLORY, "y": "node:node1"}}, r0=[_desc("x", "P0", (0,))])
    assert state.persisted.entries[("x", 0)][1] == ""  # kept as no one's
    assert _listed(state, MALLORY) == [] and _listed(state, ALICE) == []


def test_plaintext_lists_every_name_to_every_driver() -> None:
    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    hello = _hello(0, [_desc("model", "P0", (0,))], {"model": ALICE})
    assert isinstance(state.handle(W[0], hello, 0.0)[0].msg, Welcome)
    state.persisted.saved(_desc("other", "P1", (1,)), (1,), ALICE)
    assert _listed(state, None) == [("model", 0), ("other", 1)]
    assert _status_names(state, None) == ["model", "other"]


def test_a_workers_hello_reports_the_owner_of_each_file_it_holds(tmp_path: Path) -> None:
    disk = SymbolDisk(tmp_path)
    disk.save(_desc("owned", "P0", (0,)), np.arange(3.0), owner=ALICE)
    disk.save(_desc("plain", "P0", (0,)), np.arange(3.0))  # a plaintext worker's: no owner
    infos, owners = SymbolDisk(tmp_path).hello_lists()  # read back from the files
    assert sorted(i.name for i in infos) == ["owned", "plain"] and owners == {"owned": ALICE}
    hello = _hello(0, infos, owners)
    assert decode(encode(hello), unpickle=False) == hello


# -- loading a guessed name (w31-load) --------------------------------------------------------


def _open(state: BrokerState, who: str) -> str:
    peer = who.encode()
    opened = state.handle(peer, OpenSession(1, "", 60.0, "c"), 0.4, who=who)
    return next(a.msg.session for a in opened if isinstance(a.msg, SessionOpened))


def _load(
    state: BrokerState, who: str, sid: str, name: str, parties: tuple[int, ...] = ()
) -> Reply:
    peer = who.encode()
    return _reply(state.handle(peer, LoadSymbol(sid, 2, name, parties), 0.5, who=who), peer)


def _delete(state: BrokerState, who: str, sid: str, name: str) -> Reply:
    peer = who.encode()
    return _reply(state.handle(peer, DeleteSymbol(sid, 3, name, ()), 0.5, who=who), peer)


def _without(reply: Reply, name: str) -> str:
    """The error a reply carries, its kind and text, with ``name`` blanked out."""
    assert reply.error is not None and reply.value is None, reply
    return f"{reply.error.kind}: {reply.error.message}".replace(repr(name), "<name>")


def test_loading_another_drivers_persisted_name_answers_as_a_name_that_does_not_exist() -> None:
    """Before w31-load the broker resolved bob's ``mp.load("payroll_cuts")`` from its whole
    table: bob learnt that alice persisted it, on which rank, with its description (only
    the read then failed on the worker). Now it answers as for a name no one has."""
    state = _secure()
    _alice_saves(state, "payroll_cuts")
    sid = _open(state, BOB)
    for parties in [(), (0,), (1,)]:
        taken = _load(state, BOB, sid, "payroll_cuts", parties)
        free = _load(state, BOB, sid, "payroll_cutz", parties)
        assert _without(taken, "payroll_cuts") == _without(free, "payroll_cutz")
    assert "payroll_cuts" not in state.sessions.by_id[sid].loaded  # nor may bob read it
    # nor does a delete tell them apart
    taken, free = _delete(state, BOB, sid, "payroll_cuts"), _delete(state, BOB, sid, "nope")
    assert _without(taken, "payroll_cuts") == _without(free, "nope")
    # alice loads it, in a later session of hers
    later = _open(state, ALICE)
    value = _load(state, ALICE, later, "payroll_cuts").value
    assert isinstance(value, SymbolInfo) and value.ranks == (0,)
    assert "payroll_cuts" in state.sessions.by_id[later].loaded


def test_a_name_another_driver_persisted_on_another_party_is_not_in_the_owners_choice() -> None:
    """Alice's and bob's ``model`` on two parties: each loads its own without saying whose
    (before w31-load: ambiguous, naming both), and asking for the other's rank answers as
    if that rank held none."""
    state = _secure(
        owners={0: {"model": ALICE}, 2: {"model": BOB}},
        r0=[_desc("model", "P0", (0,))],
        r2=[_desc("model", "P2", (2,))],
    )
    alice, bob = _open(state, ALICE), _open(state, BOB)
    mine = _load(state, ALICE, alice, "model").value
    assert isinstance(mine, SymbolInfo) and mine.ranks == (0,)
    theirs = _load(state, BOB, bob, "model").value
    assert isinstance(theirs, SymbolInfo) and theirs.ranks == (2,)
    # rank 2 (bob's model) answers as rank 1 (no model), naming only alice's own rank 0
    bobs, nobodys = (
        _load(state, ALICE, alice, "model", (2,)),
        _load(state, ALICE, alice, "model", (1,)),
    )
    assert _without(bobs, "model").replace("[2]", "[1]") == _without(nobodys, "model")
    assert "rank 2" not in _without(bobs, "model")


def test_a_name_of_no_known_owner_is_loaded_by_no_one() -> None:
    """A save reported by a Done after its job ended (owner unknown), or shares whose ranks
    name different owners: no driver loads it (until a hello names one owner)."""
    state = _secure()
    state.persisted.saved(_desc("orphan", "P0", (0,)), (0,))
    spu = _desc("shares", "SP0", (0, 1))
    state.persisted.saved(spu, (0,), ALICE)
    state.persisted.saved(spu, (1,), BOB)
    for who in (ALICE, BOB):
        sid = _open(state, who)
        for name in ("orphan", "shares"):
            reply = _load(state, who, sid, name)
            assert _without(reply, name) == _without(_load(state, who, sid, "none"), "none")
    state.handle(
        W[0], _hello(0, [_desc("orphan", "P0", (0,))], {"orphan": ALICE}), 1.0, who="node:node0"
    )
    sid = _open(state, ALICE)
    assert isinstance(_load(state, ALICE, sid, "orphan").value, SymbolInfo)


def test_plaintext_loads_any_drivers_persisted_name() -> None:
    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    hello = _hello(0, [_desc("model", "P0", (0,))], {"model": ALICE})
    assert isinstance(state.handle(W[0], hello, 0.0)[0].msg, Welcome)
    peer = b"drv:plain/1"
    opened = state.handle(peer, OpenSession(1, "", 60.0, "c"), 0.4)
    sid = next(a.msg.session for a in opened if isinstance(a.msg, SessionOpened))
    reply = _reply(state.handle(peer, LoadSymbol(sid, 2, "model"), 0.5), peer)
    assert isinstance(reply.value, SymbolInfo) and reply.value.ranks == (0,)


def test_a_save_reported_after_its_job_failed_is_still_its_drivers() -> None:
    """Alice's job on ranks 0 and 1 fails on rank 1 while rank 0 persists ``late``: rank 0's
    Done comes after the job ended. Before w32-trust the broker had forgotten whose job it
    was and kept the name as no one's: alice could neither list, load nor delete (through
    the broker) her own value until rank 0's next hello. Now the broker keeps whose each
    job that ended with ranks still to answer was; the same session's Done of one of its
    ranks saves for that driver."""
    state = _secure()
    peer = ALICE.encode()
    sid = _open(state, ALICE)
    b = GraphBuilder(3)
    b.op("constant", [], ranks=(0, 1), value=1)
    graph = b.build([])
    program = decode(encode(Program(graph.digest, graph)), unpickle=False)
    assert isinstance(program, Program)
    state.handle(peer, program, 0.1, who=ALICE)
    state.handle(peer, Exec(sid, "j", program.digest, (0, 1), {}), 0.2, who=ALICE)
    failed = Failed(sid, "j", 1, ErrorInfo("RemoteError", "boom", rank=1))
    out = state.handle(W[1], failed, 0.3, who="node:node1")
    errors = [a.msg.error for a in out if isinstance(a.msg, JobResult)]
    assert [e.message if e else None for e in errors] == ["boom"]
    late = Done(sid, "j", 0, saved=[_desc("late", "P0", (0,))])
    state.handle(W[0], late, 0.4, who="node:node0")
    assert _listed(state, ALICE) == [("late", 0)] and _listed(state, BOB) == []
    assert isinstance(_load(state, ALICE, _open(state, ALICE), "late").value, SymbolInfo)
    # a Done of another session, or a rank outside the job, names no owner
    for session, rank in (("other~x", 0), (sid, 2)):
        forged = Done(session, "j", rank, saved=[_desc(f"r{rank}", f"P{rank}", (rank,))])
        state.handle(W[rank], forged, 0.5, who=f"node:node{rank}")
    assert _listed(state, ALICE) == [("late", 0)]
