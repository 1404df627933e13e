"""The broker's budget over all sessions' own specs (w32's closing note, left over).

A session opened with ``cluster=`` brings its own spec, which the broker keeps while the
session is open (each named node's runtime_info: up to 64 KiB of text and 1,024 items
each, and up to 1,024 devices). Each spec is bounded, but nothing bounded their sum over
the broker's 10,000 sessions (256 per driver, and drivers are many): some 600 sessions
with three 60 KiB runtime_info kept 108 MB in the broker, and 10,000 would keep 1.8 GB.
Now the broker keeps open sessions' specs within ``MAX_SESSION_SPECS_TOTAL`` (sessions
opened with equal specs share one copy, counted once), and refuses an open past it with a
``ClusterSpecError`` saying why.

Through the broker's real state machine, ``OpenSession`` as a driver sends it.
"""

from __future__ import annotations

import contextlib
import tracemalloc
from typing import Any

import pytest
import zmq
from test_batch_nesting import _answer, broker_process  # noqa: F401  (a fixture)

from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.limits import MAX_RUNTIME_INFO_TEXT as MAX_TEXT
from mpl.wire.limits import MAX_SESSION_SPECS_TOTAL
from mpl.wire.sessions import (
    CloseSession,
    OpenSession,
    Reply,
    SessionOpened,
    SessionRuntime,
    StatusRequest,
)

_CLUSTER = ClusterSpec.simple(3, enable_spu=False)


def _spec(n: int) -> dict[str, Any]:
    """A session spec naming all three nodes, each with 60 KiB of runtime_info unique to
    ``n`` (within the per-node bound of 64 KiB)."""
    spec = _CLUSTER.to_dict()
    for node in spec["nodes"]:
        node["runtime_info"] = {"blob": f"{n:08d}" + "x" * 60_000}
    return spec


def _open(state: BrokerState, n: int, spec: dict[str, Any]) -> Any:
    """Driver ``d<n // 200>`` (200 sessions each: within the 256 one driver may hold)
    opens session ``s<n>`` with ``spec``, as decoded off the wire; its answer."""
    msg = decode(encode(OpenSession(n + 1, f"s{n}", 60.0, f"c{n}", cluster=spec)))
    out = state.handle(f"drv:d{n // 200}/1".encode(), msg, 0.1)
    (answer,) = [a.msg for a in out]
    return answer


def test_sessions_specs_stay_within_a_budget() -> None:
    state = BrokerState(_CLUSTER, now=0.0, broker_id="B")
    opens = 600
    tracemalloc.start()
    try:
        answers = [_open(state, n, _spec(n)) for n in range(opens)]
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    opened = [a for a in answers if isinstance(a, SessionOpened)]
    refused = [a for a in answers if isinstance(a, Reply) and a.error is not None]
    assert kept <= MAX_SESSION_SPECS_TOTAL * 1.25, f"{kept >> 20} MiB kept for {opens} specs"
    assert opened and refused and len(opened) + len(refused) == opens
    error = refused[0].error
    assert error is not None and error.kind == "ClusterSpecError"
    assert "own cluster specs" in error.message and str(MAX_SESSION_SPECS_TOTAL) in error.message
    assert len(state.sessions.by_id) == len(opened)  # a refused open leaves no session
    # a close makes room for the next
    first = opened[0]
    state.handle(b"drv:d0/1", CloseSession(first.session, "c0"), 0.2)
    assert isinstance(_open(state, opens, _spec(opens)), SessionOpened)


def test_sessions_opened_with_one_spec_share_one_copy() -> None:
    state = BrokerState(_CLUSTER, now=0.0, broker_id="B")
    spec = _spec(0)
    answers = [_open(state, n, spec) for n in range(400)]  # far past the budget if copied
    assert all(isinstance(a, SessionOpened) for a in answers)
    assert state.sessions.specs.weight < 300_000  # one copy counted, about 180 KiB
    for n, answer in enumerate(answers):
        state.handle(f"drv:d{n // 200}/1".encode(), CloseSession(answer.session, f"c{n}"), 0.2)
    assert state.sessions.specs.weight == 0 and not state.sessions.by_id


def test_one_driver_cannot_take_every_other_drivers_room_for_specs() -> None:
    """A listed driver may hold 256 sessions; with specs near their bounds (at world 32,
    32 nodes' 64 KiB runtime_info each) a few fill the budget over all sessions, and no
    other driver could then open a session with a spec of its own. Each listed driver
    now has its share (the budget over the number of listed drivers); here a budget of
    2 MiB stands for the 64 MiB."""
    from test_red31b_persisted_names import ALICE, BOB, _secure

    state = _secure()  # a secure broker whose spec lists alice and bob
    state.sessions.specs.budget = 2 << 20
    base = state.cluster.to_dict()

    def spec(n: int) -> dict[str, Any]:
        own = {**base, "nodes": [dict(node) for node in base["nodes"]]}
        for node in own["nodes"]:
            node["runtime_info"] = {"blob": f"{n:08d}" + "x" * 60_000}
        return own

    def open_as(who: str, n: int) -> Reply | None:
        """The refusal, or None: the open goes on (its nodes' workers are asked)."""
        msg = OpenSession(n + 1, f"{who[7:]}{n}", 60.0, f"c{n}", cluster=spec(n))
        out = state.handle(who.encode(), msg, 0.1, who=who)
        refused = [a.msg for a in out if isinstance(a.msg, Reply)]
        assert refused or any(isinstance(a.msg, SessionRuntime) for a in out)
        return refused[0] if refused else None

    hers = [open_as(ALICE, n) for n in range(20)]  # 20 x 180 KiB: past the whole budget
    refused = [a for a in hers if a is not None]
    assert refused, "alice's 20 opens all fit"
    assert open_as(BOB, 100) is None, "alice took bob's room too"
    assert refused[0].error is not None and "driver:alice's share" in refused[0].error.message


def test_a_drivers_share_counts_each_copy_it_uses_once_and_is_given_back() -> None:
    from mpl.broker.session_specs import SessionSpecs

    specs = SessionSpecs(budget=1000, drivers=2)  # a share of 500 each
    one = {"blob": "x" * 300}  # weighs its 304 characters and 3 items of 64: 496
    kept = specs.keep(one, "driver:a")
    assert not isinstance(kept, str)
    again = specs.keep(dict(one), "driver:a")  # the same copy: not counted twice
    assert not isinstance(again, str) and again[1] == kept[1]
    assert isinstance(specs.keep({"blob": "y" * 10}, "driver:a"), str)  # past a's share
    theirs = specs.keep(dict(one), "driver:b")  # b's share counts the copy it uses too
    assert not isinstance(theirs, str) and specs.weight == 496
    for owner in ("driver:a", "driver:a", "driver:b"):
        specs.release(kept[1], owner)
    assert specs.weight == 0
    assert not isinstance(specs.keep({"blob": "y" * 10}, "driver:a"), str)  # room again


@pytest.mark.timeout(300)
def test_a_real_broker_refuses_opens_past_its_budget_for_specs(
    broker_process: tuple[str, int],  # noqa: F811
) -> None:
    """The same attack on a real ``mpl-broker`` (2 ranks, plaintext, no workers), from
    raw DEALERs declaring three drivers: 600 opens of 2 x 60 KiB runtime_info each."""
    from test_batch_nesting import _peak_rss

    address, pid = broker_process
    base = ClusterSpec.simple(2, enable_spu=False).to_dict()
    with contextlib.ExitStack() as stack:
        ctx: zmq.Context[Any] = zmq.Context()
        stack.callback(ctx.term)
        socks = []
        for d in range(3):
            sock = ctx.socket(zmq.DEALER)
            stack.callback(sock.close, 0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, f"drv:d{d}/1".encode())
            sock.connect(address)
            socks.append(sock)
        socks[0].send_multipart(to_wire(encode(StatusRequest(1))))
        assert isinstance(_answer(socks[0], Reply), Reply)  # up and warm
        before = _peak_rss(pid)
        opened = refused = 0
        for n in range(600):
            spec = {**base, "nodes": [dict(node) for node in base["nodes"]]}
            for node in spec["nodes"]:
                node["runtime_info"] = {"blob": f"{n:08d}" + "x" * 60_000}
            sock = socks[n // 200]
            sock.send_multipart(
                to_wire(encode(OpenSession(n + 1, f"s{n}", 600.0, "c", cluster=spec)))
            )
            assert sock.poll(60_000), f"no answer to open {n}"
            answer = decode(from_wire(sock.recv_multipart()), unpickle=False)
            if isinstance(answer, SessionOpened):
                opened += 1
            else:
                assert isinstance(answer, Reply), answer
                assert answer.error is not None and answer.error.kind == "ClusterSpecError"
                assert "own cluster specs" in answer.error.message
                refused += 1
        grown = _peak_rss(pid) - before
    assert refused and opened + refused == 600
    assert grown <= 2 * MAX_SESSION_SPECS_TOTAL, f"the broker grew {grown >> 20} MiB"


def test_runtime_info_holds_no_value_its_bounds_do_not_weigh() -> None:
    """The bounds on a node's runtime_info (and so both budgets over sessions) count
    its text and items: an array, an opaque buffer or a huge integer counted as one item
    of 64 whatever its size. 16 MiB of array in one session's spec was kept by the broker
    and relayed to the worker as 64. Now runtime_info holds text, numbers, booleans,
    None, lists and maps only (integers' bytes counted as text)."""
    import numpy as np

    from mpl.worker.session_runtime import SessionRuntimes

    state = BrokerState(_CLUSTER, now=0.0, broker_id="B")
    for bad in (np.zeros(16 << 20, dtype=np.uint8), {1, 2}, 3 + 4j, 1 << (8 * MAX_TEXT)):
        spec = _CLUSTER.to_dict()
        spec["nodes"][0]["runtime_info"] = {"blob": bad}
        answer = _open(state, len(state.sessions.by_id) + 100, spec)
        assert isinstance(answer, Reply) and answer.error is not None, type(bad)
        assert answer.error.kind == "ClusterSpecError", answer.error
        assert "runtime_info" in answer.error.message
    assert not state.sessions.by_id and state.sessions.specs.weight == 0
    node = SessionRuntimes(0, lambda: {})  # a broker's word reaching a worker: the same
    assert node.refusal({"blob": np.zeros(4, dtype=np.uint8)}) is not None
    assert node.refusal({"v": 1, "f": 2.5, "t": True, "n": None, "l": [1, "a"], "b": b"x"}) is None


def test_a_sessions_devices_hold_no_value_the_budget_does_not_weigh() -> None:
    """A device's ``config`` is any mapping: an array there weighed 64 against the
    budget, whatever its size. A spec holding anything but text, numbers, booleans, None,
    lists and maps is refused."""
    import numpy as np

    state = BrokerState(_CLUSTER, now=0.0, broker_id="B")
    spec = _CLUSTER.to_dict()
    first = next(iter(spec["devices"]))
    spec["devices"][first]["config"] = {"blob": np.zeros(16 << 20, dtype=np.uint8)}
    answer = _open(state, 0, spec)
    assert isinstance(answer, Reply) and answer.error is not None, "kept at the weight of 64"
    assert answer.error.kind == "ClusterSpecError" and "type" in answer.error.message
    assert not state.sessions.by_id and state.sessions.specs.weight == 0
