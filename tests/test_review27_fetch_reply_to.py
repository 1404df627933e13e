"""Review (round 16, pre-existing): a worker seals a fetch's value for whatever driver the
Fetch's ``reply_to`` names, a field the broker forwards as written. A hostile broker whose
operator also holds a driver key the worker's spec lists (the broker "may be run by one
of" the parties) forges a Fetch of another driver's session naming its own driver, with a
ticket of its choosing, and opens the reply: that session's value, sealed end to end for
the wrong party. The worker knows which driver sealed the session's jobs; it asks nothing."""

from __future__ import annotations

import pytest
import zmq

from mpl.wire.data import Fetch
from mpl.wire.jobs import Exec
from mpl.wire.seal import Sealer, exec_context, fetch_context
from mpl.wire.sessions import Reply
from mpl.worker.sealing import WorkerSeal


def _sealers() -> tuple[Sealer, Sealer, Sealer]:
    """Drivers a and b, and node n0 whose spec lists both."""
    a, b, n = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    node_pub = {"node:n0": n[0].decode()}
    return (
        Sealer(a[1].decode(), "driver:a", node_pub),
        Sealer(b[1].decode(), "driver:b", node_pub),
        Sealer(n[1].decode(), "node:n0", {"driver:a": a[0].decode(), "driver:b": b[0].decode()}),
    )


@pytest.mark.xfail(
    strict=True,
    reason="review27: a fetch's reply is sealed for the reply_to the broker wrote, not for a "
    "driver whose sealed jobs the session ran",
)
def test_a_forged_fetch_cannot_have_another_drivers_session_value_sealed_for_its_driver() -> None:
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    # driver a runs a job in its session "sa" here (its value "v" stays on the worker)
    context = exec_context("sa", "j1", "d", (0,), (0,), 5.0)
    msg = Exec("sa", "j1", "d", (0,), {}, (0,), 5.0)
    assert worker.open_exec(msg, "j1", a.seal([1], "node:n0", context, safe=False)) == [1]
    # the broker forges a Fetch of a's value for driver b, with a ticket it chose
    forged = Fetch("sa", 7, 0, "v", "driver:b", "chosen")
    assert worker.inbound(forged) == (forged, None)
    reply = worker.outbound(Reply(7, "a's secret"))
    assert type(reply) is Reply
    opened = None
    if reply.error is None:
        opened = b.open(reply.value, fetch_context("sa", 0, "v", "chosen"), sender="node:n0")
    assert opened is None, f"driver b read driver a's value: {opened!r}"
