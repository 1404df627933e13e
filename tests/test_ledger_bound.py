"""The broker's job ledger holds a bounded number of bytes, whatever its workers send.

A rank's stats blob may be up to MAX_STATS_BYTES (256 KiB) per job, and the ledger keeps
the last 200 jobs for the timeline: kept whole, a hostile worker sending maximal blobs made
the broker hold ~50 MiB. The ledger keeps only the first TIMES_BYTES of each blob (all the
timeline reads). Counted in bytes reachable from the ledger, never timed.
"""

from __future__ import annotations

import gc
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

import msgpack
import zmq

from mpl.broker.daemon import Broker
from mpl.wire import GraphBuilder
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, decode, encode, from_wire, to_wire
from mpl.wire.control import WorkerHello
from mpl.wire.jobs import Done, Exec, Program
from mpl.wire.run_stats import MAX_STATS_BYTES, TIMES_BYTES, pack_stats
from mpl.wire.sessions import OpenSession, SessionOpened

_SKIP = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType)


def _held_bytes(root: Any) -> int:
    """Bytes of every buffer (bytes, frames) reachable from ``root``'s own objects."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        try:
            total += memoryview(obj).nbytes
            continue
        except TypeError:
            pass
        stack.extend(gc.get_referents(obj))
    return total


class _Recorder:
    """Stands in for the broker's ROUTER once it is up: keeps what the broker sends."""

    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
        self.sent.append(frames)


def test_a_worker_sending_maximal_stats_blobs_leaves_the_ledger_bounded_in_bytes() -> None:
    broker = Broker(ClusterSpec.simple(2), "inproc://ledger-bound")
    router, recorder = broker.router, _Recorder()
    broker.router = recorder  # type: ignore[assignment]
    workers, driver = [b"\x00w0", b"\x00w1"], b"drv:ledger/0001"

    def route(peer: bytes, frames: list[Any]) -> None:
        broker._route([zmq.Frame(peer), *(zmq.Frame(bytes(f)) for f in to_wire(frames))])
        broker._flush()

    try:
        for rank, peer in enumerate(workers):
            route(peer, encode(WorkerHello(rank, f"i{rank}", 1, "h", "tcp://x:1", "")))
        route(driver, encode(OpenSession(1, "", 600.0, "ledger")))
        opened = decode(from_wire(recorder.sent[-1][1:]), unpickle=False)
        assert isinstance(opened, SessionOpened)
        builder = GraphBuilder(2)
        graph = builder.build(builder.op("constant", [], ranks=(0, 1), value=1))
        route(driver, encode(Program(graph.digest, graph)))
        honest = pack_stats(1.5e-05, 1.7e9, [[0, "pcall", 1e-06, 1.4e-05]])
        # rank 1's worker: a blob as long as the broker takes, its times first, then filler
        head = pack_stats(0.25, 1.8e9, [])[:TIMES_BYTES]
        hostile = head + b"\x00" * (MAX_STATS_BYTES - len(head))
        jobs = broker.ledger.recent.maxlen
        assert jobs is not None
        for n in range(jobs + 10):
            job = f"j{n}"
            route(driver, encode(Exec(opened.session, job, graph.digest, (0, 1), {}, (0,), 9)))
            route(workers[0], encode(Done(opened.session, job, 0, {0: 1}, honest, {})))
            if n % 2:  # as the codec sends a long blob: in a frame of its own
                route(workers[1], encode(Done(opened.session, job, 1, {0: 1}, hostile, {})))
            else:  # packed by hand into the header, which the lean reader takes
                done = ["done", opened.session, job, 1, {0: 1}, hostile, {}, []]
                route(workers[1], [MAGIC_FRAME, msgpack.packb(done, use_bin_type=True)])
            # the answer went, the hostile blob in it whole
            assert sum(map(len, recorder.sent[-1])) > MAX_STATS_BYTES
        recorder.sent.clear()
        ledger = broker.ledger
        assert ledger.outcomes["ok"] == jobs + 10 and len(ledger.recent) == jobs
        held = _held_bytes(ledger)
        # the job ids and sessions are str (not counted): what is held is each rank's head
        # (before: every blob whole, ~50 MiB for the one hostile rank)
        assert held <= jobs * 2 * TIMES_BYTES
        # and the timeline still draws each rank's own times
        assert ledger.recent[-1].ranks == {0: (1.7e9, 1.5e-05), 1: (1.8e9, 0.25)}
    finally:
        broker.router = router
        broker.close()


def test_a_blobs_times_are_read_from_its_first_bytes_alone_and_checked() -> None:
    from mpl.wire.errors import ProtocolError
    from mpl.wire.run_stats import read_times

    blob = pack_stats(0.5, 1.7e9, [[i, "op", 0.0, 1.0] for i in range(50)])
    assert read_times(blob[:TIMES_BYTES]) == read_times(blob) == (1.7e9, 0.5)
    assert read_times(pack_stats(1, 2, [])) == (2.0, 1.0)  # ints are numbers too
    for junk in (b"", b"\x94", b"\x93\x01\x02", b"\x94\xa1x\x01", b"\x94\xdb\xff\xff\xff\xff"):
        try:
            read_times(junk)
        except ProtocolError:
            continue
        raise AssertionError(f"read {junk!r}")
