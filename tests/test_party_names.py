"""Persisted names belong to the parties that hold them (issue 11, part 4).

Each party persists under its own namespace: the broker keeps one entry per (name, rank),
rebuilt from each worker's own list on every registration, and a load says whose value it
means or the holders must make one value.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpl.driver as mp
from mpl.broker.state import BrokerState, Send
from mpl.wire import ClusterSpec
from mpl.wire.control import WorkerHello
from mpl.wire.errors import SessionError
from mpl.wire.record import Record
from mpl.wire.sessions import (
    Ack,
    DeleteSymbol,
    LoadSymbol,
    OpenSession,
    Reply,
    SaveSymbol,
    SessionOpened,
    SymbolInfo,
)

W = [b"w0", b"w1", b"w2"]
A = b"drv:alice/1"


def _hello(rank: int, symbols: list[SymbolInfo], inc: str = "") -> WorkerHello:
    return WorkerHello(
        rank, inc or f"inc{rank}", 100 + rank, "host", f"tcp://x:{rank}", "", symbols=symbols
    )


def _sent(actions: list[Send], kind: type[Record]) -> list[Any]:
    return [a.msg for a in actions if isinstance(a.msg, kind)]


def _persisted(name: str, device: str, ranks: tuple[int, ...]) -> SymbolInfo:
    return SymbolInfo(name, device, ranks, True, {"meta": device})


def _broker(symbols: dict[int, list[SymbolInfo]]) -> tuple[BrokerState, str]:
    state = BrokerState(ClusterSpec.simple(3), now=0.0, broker_id="B")
    for rank in range(3):
        state.handle(W[rank], _hello(rank, symbols.get(rank, [])), 0.0)
    out = state.handle(A, OpenSession(1, "", 60.0, "c"), 0.0)
    return state, _sent(out, SessionOpened)[0].session


def _load(state: BrokerState, sid: str, name: str, parties: tuple[int, ...] = ()) -> Reply:
    reply: Reply = _sent(state.handle(A, LoadSymbol(sid, 7, name, parties), 0.1), Reply)[0]
    return reply


def test_two_parties_keep_their_own_value_under_one_name() -> None:
    state, sid = _broker(
        {0: [_persisted("model", "P0", (0,))], 2: [_persisted("model", "P2", (2,))]}
    )
    ambiguous = _load(state, sid, "model").error
    assert ambiguous is not None and ambiguous.kind == "SessionError"
    assert "rank 0 (P0)" in ambiguous.message and "rank 2 (P2)" in ambiguous.message
    assert "parties=" in ambiguous.message
    assert _load(state, sid, "model", (0,)).value.device == "P0"
    assert _load(state, sid, "model", (2,)).value.device == "P2"
    missing = _load(state, sid, "model", (1,)).error
    assert missing is not None and "not persisted on rank(s) [1]" in missing.message
    both = _load(state, sid, "model", (0, 2)).value  # asked explicitly: one party-level value
    assert both.device == "" and both.ranks == (0, 2)


def test_a_save_by_one_party_leaves_the_others_entry() -> None:
    state, sid = _broker({0: [_persisted("model", "P0", (0,))]})
    info = SymbolInfo("model", "P1", (1,), True, {})
    out = state.handle(A, SaveSymbol(sid, 3, "j/0", info), 0.1)
    bid = _sent(out, SaveSymbol)[0].req
    state.handle(W[1], Ack(bid, 1), 0.2)
    assert sorted(state.persisted.holders("model")) == [0, 1]
    assert _load(state, sid, "model", (1,)).error is None  # deletes come after a load
    out = state.handle(A, DeleteSymbol(sid, 4, "model", (1,)), 0.3)
    unsave = _sent(out, DeleteSymbol)
    assert [(m.ranks, m.persist) for m in unsave] == [((1,), True)]
    state.handle(W[1], Ack(unsave[0].req, 1), 0.4)
    assert sorted(state.persisted.holders("model")) == [0]  # rank 0's value untouched
    assert _load(state, sid, "model").value.device == "P0"


def test_each_registration_replaces_that_ranks_entries_only() -> None:
    state, _ = _broker({0: [_persisted("a", "P0", (0,))], 1: [_persisted("a", "P1", (1,))]})
    # rank 0 comes back (a restart) with another list: its old entries go, rank 1's stay
    state.handle(W[0], _hello(0, [_persisted("b", "P0", (0,))], inc="again"), 1.0)
    assert state.persisted.holders("a").keys() == {1}
    assert state.persisted.holders("b").keys() == {0}
    # a worker lists only its own rank's files: a claim for another rank is ignored
    state.handle(W[2], _hello(2, [_persisted("c", "P0", (0,))], inc="again"), 1.0)
    assert "c" not in state.persisted


def test_an_spu_value_loads_only_with_all_its_shares() -> None:
    shares = _persisted("secret", "SP0", (0, 1, 2))
    state, sid = _broker({0: [shares], 1: [shares], 2: [shares]})
    assert _load(state, sid, "secret").value.ranks == (0, 1, 2)
    partial = _load(state, sid, "secret", (0, 1)).error
    assert partial is not None and "all of them together" in partial.message
    state.handle(W[2], _hello(2, [], inc="again"), 1.0)  # rank 2 lost its file
    assert _load(state, sid, "secret").error is not None


@pytest.mark.daemons
def test_same_name_from_two_parties_survives_a_broker_restart(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", world_size=2)
    for rank, value in ((0, np.arange(3)), (1, np.full(2, 7.0))):
        with contextlib.closing(mp.connect(cluster.address, driver=f"owner{rank}")) as ctx, ctx:
            held = mp.device(f"P{rank}")(lambda v: v)(value)
            mp.save(held, "model", persist=True)
            assert ctx.session
    cluster.impl.kill_broker()
    cluster.impl.start_broker()
    cluster.impl.wait_ready(10.0)
    with contextlib.closing(mp.connect(cluster.address, driver="reader")) as reader, reader:
        with pytest.raises(SessionError, match="several parties"):
            mp.load("model")
        mine = mp.load("model", parties=(0,))
        assert mine.device == "P0" and mine.parties == (0,)
        assert mp.fetch(mine).tolist() == [0, 1, 2]
        theirs = mp.load("model", parties="P1")
        assert mp.fetch(theirs).tolist() == [7.0, 7.0]
        mp.delete("model", parties=(1,))  # forgets rank 1's value only
        assert mp.fetch(mp.load("model")).tolist() == [0, 1, 2]


def test_load_and_save_inside_a_function_are_part_of_the_call(tmp_path: Path) -> None:
    with contextlib.closing(mp.Simulator.simple(2, data_root=tmp_path)) as sim, sim:
        mp.save(mp.put("P1", np.arange(4.0)), "weights", persist=True)

        @mp.function
        def step(scale: Any) -> Any:
            w = mp.load("weights", parties=(1,))
            out = mp.device("P1")(lambda a, s: a * s)(w, scale)
            mp.save(out, "scaled")
            mp.save(out, "kept", persist=True)
            return mp.device("P1")(np.sum)(out)

        assert mp.fetch(step(mp.put("P1", 2.0))) == 12.0
        assert mp.fetch(mp.load("scaled")).tolist() == [0.0, 2.0, 4.0, 6.0]
        program = mp.compile(step, mp.put("P1", 1.0))
        # the saves are ops of the job: a future of it names them too
        assert mp.fetch(mp.submit(program, mp.put("P1", 3.0)).result()) == 18.0
        assert mp.fetch(mp.load("scaled")).tolist() == [0.0, 3.0, 6.0, 9.0]
    again = mp.Simulator.simple(2, data_root=tmp_path)  # a new cluster on the same disks
    with contextlib.closing(again), again:
        assert mp.fetch(mp.load("kept", parties=(1,))).tolist() == [0.0, 3.0, 6.0, 9.0]
        # traced in the other session: the job's load op reads rank 1's own file
        assert mp.fetch(program(mp.put("P1", 1.0))) == 6.0
