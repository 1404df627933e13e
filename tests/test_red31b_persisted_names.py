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
from mpl.wire.jobs import Done, Exec, JobResult, Program
from mpl.wire.sessions import (
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
