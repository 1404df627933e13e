"""Review w33: a driver's share of the broker's room for specs also bounds what it can
make one worker keep.

w33 gave each listed driver its share of the broker's budget over sessions' own specs
(64 MiB over the listed drivers), so that one driver cannot take every other's room. But
each worker keeps the runtime_info those specs carry for its node within a budget of its
own, ``MAX_RUNTIME_INFO_TOTAL`` (16 MiB, against a hostile broker: it has no idea whose a
session is). A share of the broker's budget (32 MiB with two drivers) is more than a
worker's whole budget: one driver's sessions, each naming node 0 with runtime_info near
its bounds, filled node 0's budget, and every other driver's session bringing its own
runtime_info to node 0 was refused there. Now a driver's share is of the smaller of the
two budgets: every listed driver's sessions together stay within what each worker keeps.

The broker's real state machine (each message from its authenticated sender) and each
worker's real table of sessions' runtime_info, answering the broker as a worker does.
"""

from __future__ import annotations

from typing import Any

from test_red31b_persisted_names import ALICE, BOB, W, _secure

from mpl.broker.state import BrokerState
from mpl.wire.limits import MAX_RUNTIME_INFO_TOTAL
from mpl.wire.sessions import OpenSession, Reply, SessionOpened, SessionRuntime
from mpl.worker.session_runtime import SessionRuntimes


def _open(state: BrokerState, nodes: list[SessionRuntimes], who: str, n: int) -> Any:
    """``who`` opens session ``n`` with runtime_info near its bounds for node 0; each
    named node's worker answers. What the driver gets: SessionOpened or a Reply."""
    spec = state.cluster.to_dict()
    spec["nodes"] = [dict(node) for node in spec["nodes"]]
    # 60 KiB of text and 900 items: about 118 KB as both budgets weigh it
    spec["nodes"][0]["runtime_info"] = {"blob": f"{n:08d}" + "x" * 60_000, "l": [0] * 900}
    msg = OpenSession(n + 1, f"s{n}", 60.0, f"c{n}", cluster=spec)
    out = state.handle(who.encode(), msg, 0.1, who=who)
    answers = [a.msg for a in out if a.peer == who.encode()]
    for send in out:
        if isinstance(send.msg, SessionRuntime):
            rank = W.index(send.peer)
            ack = nodes[rank].open(send.msg)
            assert ack is not None
            back = state.handle(W[rank], ack, 0.1, who=f"node:node{rank}")
            answers += [a.msg for a in back if a.peer == who.encode()]
    (answer,) = answers
    return answer


def test_one_driver_cannot_fill_a_workers_room_for_runtime_info() -> None:
    state = _secure()  # alice and bob listed
    nodes = [SessionRuntimes(rank, lambda: {}) for rank in range(3)]
    bobs = [_open(state, nodes, BOB, n) for n in range(250)]  # within his 256 sessions
    assert any(isinstance(a, Reply) for a in bobs), "bob's 250 opens all fit"
    assert nodes[0].weight <= MAX_RUNTIME_INFO_TOTAL // 2, "bob took more than his share"
    hers = _open(state, nodes, ALICE, 1000)
    assert isinstance(hers, SessionOpened), hers
    assert nodes[0].refused == 0  # the broker refused bob's past his share, not the worker
