"""One bad message or one bad job never takes a daemon down (issue 10, containment).

Hostile records are built byte by byte (our own encoder refuses to write them) and sent
from raw sockets to live daemons; after each, the daemon answers status within 1 s and
its error counter has moved.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from helpers import double, nap, stats, wait_until

from mpl.wire import ClusterSpec, GraphBuilder, RemoteError, SessionError
from mpl.wire.codec import MAGIC_FRAME, pickle_by_value, to_wire

pytestmark = pytest.mark.daemons
pickle_by_value(sys.modules[__name__])  # the workers do not have this module

HUGE = 10**5000  # 5,000 digits: Python refuses to turn it into text
DEPTH = 600


def _ext(code: int, payload: bytes) -> bytes:
    return bytes(msgpack.packb(msgpack.ExtType(code, payload)))


def _p(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def _huge() -> bytes:
    return _ext(7, HUGE.to_bytes((HUGE.bit_length() + 8) // 8, "big", signed=True))


def _deep() -> bytes:
    return b"\x91" * DEPTH + b"\x90"  # [[[...[]...]]], 600 lists deep


def _record(tag: str, *fields: bytes) -> list[bytes]:
    """A message whose header is the msgpack array [tag, *fields] (fields already packed)."""
    return [MAGIC_FRAME, bytes([0x90 + 1 + len(fields)]) + _p(tag) + b"".join(fields)]


def _errors(status: dict[str, Any]) -> int:
    return int(status.get("protocol_errors", 0)) + int(status.get("internal_errors", 0))


def _raw_call(sock: zmq.Socket[Any], frames: list[bytes]) -> bool:
    sock.send_multipart(to_wire(frames))
    if not sock.poll(10_000):  # a bound for a loaded machine: the answer comes at once
        return False
    sock.recv_multipart()
    return True


def test_hostile_records_leave_the_broker_serving(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    ctx = zmq.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.linger = 0
        raw.connect(cluster.address)
        opening = _record("open", _p(1), _p(""), _p(60.0), _p("raw"), _p(None), _p(None))
        assert _raw_call(raw, opening)
        sid = client.status()["sessions"][0]["session"]
        hostile = {
            "a 5,000-digit rank in a fetch": _record("fetch", _p(sid), _p(2), _huge(), _p("0/0")),
            "a 5,000-digit rank in a hello": _record(
                "hello", _huge(), _p("i"), _p(1), _p("h"), _p("tcp://x:1"), _p(""), _p([]), _p("")
            ),
            "a value 600 deep in a save": _record(
                "save",
                _p(sid),
                _p(3),
                _p("0/0"),
                _ext(
                    5,
                    b"\x96"
                    + _p("symbol")
                    + _p("n")
                    + _p("P0")
                    + _ext(4, _p([0]))
                    + _p(False)
                    + b"\x81"
                    + _p("x")
                    + _deep(),
                ),
            ),
        }
        for what, frames in hostile.items():
            before = _errors(client.status())
            raw.send_multipart(to_wire(frames))
            assert raw.poll(10_000), f"{what}: the sender is told"
            raw.recv_multipart()
            after = client.status(timeout=5.0)  # still serving (a wedged one never answers)
            assert _errors(after) > before, what
        b = GraphBuilder(2)
        x = b.op("constant", [], ranks=(0,), value=4)[0]
        y = b.op("pcall", [x], ranks=(0,), fn=b.fn(double))[0]
        fresh = client.open_session().session
        assert client.submit(fresh, b.build([y]), {}, inline=(0,), timeout=5).values[0] == {0: 8}
    finally:
        ctx.destroy(linger=0)


def exit_now() -> None:
    sys.exit(3)


def interrupt() -> None:
    raise KeyboardInterrupt


def generator_exit() -> None:
    raise GeneratorExit


def make_lock() -> Any:
    return threading.Lock()


@pytest.mark.parametrize(
    ("fn", "kind"),
    [(exit_now, "SystemExit"), (interrupt, "KeyboardInterrupt"), (generator_exit, "GeneratorExit")],
)
def test_base_exceptions_from_user_code_fail_the_job_and_the_session_goes_on(
    make_cluster: Any, fn: Any, kind: str
) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    b.op("pcall", [], ranks=(0,), fn=b.fn(fn))
    bad = b.build([])
    with pytest.raises(RemoteError) as err:
        client.submit(sid, bad, {}, timeout=5)
    assert err.value.remote_type == kind and err.value.rank == 0
    client.status(timeout=5.0)
    wait_until(lambda: stats(client, 0).get("jobs_failed", 0) >= 1, timeout=15, what="the count")
    ok = GraphBuilder(2)
    x = ok.op("constant", [], ranks=(0,), value=5)[0]
    y = ok.op("pcall", [x], ranks=(0,), fn=ok.fn(double))[0]
    # the same session's next job runs at once: its runner did not die
    assert client.submit(sid, ok.build([y]), {}, inline=(0,), timeout=10).values[0] == {0: 10}


def test_an_unencodable_fetch_is_a_remote_error_naming_its_type(make_cluster: Any) -> None:
    spec = dataclasses.replace(ClusterSpec.simple(2, enable_spu=False), trusted=True)
    cluster = make_cluster("tcp", spec=spec)
    client = cluster.client(trusted=True)
    sid = client.open_session().session
    b = GraphBuilder(2)
    lock = b.op("pcall", [], ranks=(0,), fn=b.fn(make_lock))[0]
    job = client.submit(sid, b.build([lock]), {}, timeout=5).job
    before = stats(client, 0).get("internal_errors", 0)
    with pytest.raises(RemoteError, match="lock") as err:
        client.fetch(sid, 0, f"{job}/0", timeout=5)
    assert err.value.rank == 0
    client.status(timeout=5.0)
    wait_until(
        lambda: stats(client, 0).get("internal_errors", 0) > before,
        timeout=15,
        what="rank 0 to count the failed encoding",
    )
    arr = GraphBuilder(2)
    v = arr.op("constant", [], ranks=(0,), value=np.arange(3))[0]
    job2 = client.submit(sid, arr.build([v]), {}, timeout=5).job
    assert client.fetch(sid, 0, f"{job2}/0", timeout=5).tolist() == [0, 1, 2]


class _BrokenStats:
    """An extension whose counters fail twice (then recover, so heartbeats resume)."""

    def __init__(self) -> None:
        self.failures = 0

    def stats(self) -> dict[str, int]:
        if self.failures < 2:
            self.failures += 1
            raise RuntimeError("stats are broken")
        return {}


def test_a_failing_timer_is_contained_and_the_worker_serves_on(make_cluster: Any) -> None:
    cluster = make_cluster("inproc", extensions={0: {"broken": _BrokenStats}})
    worker = cluster.impl.workers[0]
    worker.jobs.extension("broken")  # the next two heartbeats' stats() raise
    wait_until(lambda: worker._faults["internal_errors"] >= 2, what="two failed heartbeats")
    assert worker._thread is not None and worker._thread.is_alive()
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("constant", [], ranks=(0,), value=21)[0]
    y = b.op("pcall", [x], ranks=(0,), fn=b.fn(double))[0]
    assert client.submit(sid, b.build([y]), {}, inline=(0,), timeout=5).values[0] == {0: 42}


def test_calls_in_flight_fail_soon_after_the_broker_restarts(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    b.op("pcall", [], ranks=(0,), fn=b.fn(nap), args=(30.0,))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            client.submit(sid, b.build([]), {}, timeout=20)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: stats(client, 0).get("jobs_running") == 1, what="the job to start")
    cluster.impl.kill_broker()
    cluster.impl.start_broker()
    restarted = time.monotonic()
    t.join(10)
    assert errors and isinstance(errors[0], SessionError), errors
    assert "restarted" in str(errors[0])
    assert time.monotonic() - restarted < 4.0  # the next heartbeat (1 s) tells the driver
