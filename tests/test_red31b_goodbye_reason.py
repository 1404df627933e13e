"""Second red team w31, finding B6: a worker's goodbye reason was kept and repeated at any
length.

A worker's ``Bye`` carries a free ``reason`` (its own word, up to a 16 MiB header). The
broker kept it whole as the lost rank's reason and repeated it: in its recent errors (20
kept: a worker saying hello and goodbye over and over left 20 such, 320 MB), in the rank's
status row (on the secure status page too, which nobody authenticates), and in the error
of every later job of every driver naming that rank ("rank 0 has no live worker (lost:
...)"). Now the broker keeps the first ``MAX_REASON_CHARS`` characters of it, and shows
as many of the host name a worker's hello gives (kept per rank, shown in every status).
"""

from __future__ import annotations

from test_authz_state import A, hello, open_session, program, sent

from mpl.broker.presence import MAX_REASON_CHARS
from mpl.broker.state import BrokerState
from mpl.broker.status_view import build_status
from mpl.wire import ClusterSpec
from mpl.wire.codec import decode, encode
from mpl.wire.control import Bye, WorkerHello
from mpl.wire.jobs import Exec, JobResult

_LONG = "x" * (1 << 20)  # 1 MiB (a header may hold 16)


def test_a_goodbye_reason_is_kept_short() -> None:
    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    for _ in range(3):  # hello and goodbye, over and over
        state.handle(b"w0", hello(0), 0.0)
        state.handle(b"w0", decode(encode(Bye(_LONG))), 0.0)
    state.handle(b"w1", hello(1), 0.0)
    assert len(state.registry.lost[0].reason) <= MAX_REASON_CHARS + 100
    assert sum(len(error) for error in state.errors) <= 3 * (MAX_REASON_CHARS + 100)
    row = build_status(state, 1.0)["ranks"][0]
    assert row["state"] == "lost" and len(row["reason"]) <= MAX_REASON_CHARS + 100
    # a driver's job naming the lost rank fails with its reason, kept short
    sid = open_session(state)
    p = program(ranks=(0, 1))
    state.handle(A, p, 0.0)
    out = state.handle(A, Exec(sid, "j", p.digest, (0, 1), {}), 0.1)
    (result,) = sent(out, JobResult, A)
    assert result.error is not None and "no live worker" in result.error.message
    assert len(result.error.message) <= MAX_REASON_CHARS + 200


def test_a_workers_host_name_is_shown_short() -> None:
    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    long_host = WorkerHello(0, "secret0", 100, _LONG, "tcp://x:0", "")
    state.handle(b"w0", decode(encode(long_host)), 0.0)
    row = build_status(state, 1.0)["ranks"][0]
    assert row["state"] == "up" and len(row["host"]) <= MAX_REASON_CHARS


def test_every_recent_error_is_kept_short() -> None:
    from mpl.wire.sessions import CloseSession

    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    for n in range(30):  # 20 kept: each quoted a 16 MiB header's session id whole
        state.handle(A, decode(encode(CloseSession(f"{n}{_LONG}", "c"))), 0.0)
    assert len(state.errors) == 20
    assert all(len(error) <= 512 for error in state.errors), [len(e) for e in state.errors]
