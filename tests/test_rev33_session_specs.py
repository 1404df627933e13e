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

import tracemalloc
from typing import Any

from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec
from mpl.wire.codec import decode, encode
from mpl.wire.limits import MAX_SESSION_SPECS_TOTAL
from mpl.wire.sessions import CloseSession, OpenSession, Reply, SessionOpened

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
