"""Batches (``mpl.wire.batch``): what is already queued for one peer goes as one message.

The wire form and its bounds; the broker's shell keeping each peer's order when a large
message sits between small ones; fewer ZeroMQ messages per job with 64 jobs in flight
(in-process, counted by a socket wrapper on the broker, and with real daemons); and
batches from raw sockets against a real broker and a real worker, each inner message
refused or dropped exactly as it would be alone.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import pytest
import zmq
from helpers import joined_workers, nap_then, raw_broker, session_with_program, wait_until

import mpl.driver as mp
from mpl.broker.daemon import Broker
from mpl.driver.launcher import daemon_command
from mpl.wire import GraphBuilder
from mpl.wire.batch import (
    BATCH_MAGIC,
    MAX_BATCH,
    batch_frames,
    coalesce,
    is_batch,
    split_batch,
)
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, decode, encode, from_wire, to_wire
from mpl.wire.control import Heartbeat, Refused, Welcome, WorkerHello
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Done, Exec, JobResult, Lit, Program
from mpl.wire.record import Record
from mpl.wire.sessions import OpenSession, Reply, SessionOpened, StatusRequest
from mpl.wire.sockets import configure
from mpl.worker.daemon import Worker

if TYPE_CHECKING:
    from mpl.driver.simulator import Simulator

# -- the wire form --------------------------------------------------------------------------


def _header(msg: Record) -> bytes:
    frames = encode(msg)
    assert len(frames) == 2
    return bytes(frames[1])


_HB = _header(Heartbeat())


def test_a_batch_splits_into_the_messages_as_they_would_arrive_alone() -> None:
    msgs = [Heartbeat(), Exec("s", "j1", "d", (0,), {}), Done("s", "j1", 0, {0: 7})]
    frames = batch_frames([_header(m) for m in msgs])
    assert frames[0] == BATCH_MAGIC != MAGIC_FRAME and is_batch(frames)
    inner = split_batch(frames)
    assert all(one[0] == MAGIC_FRAME for one in inner)
    assert [decode(one) for one in inner] == msgs
    assert not is_batch(encode(Heartbeat())) and not is_batch([])


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([BATCH_MAGIC, msgpack.packb([])], "empty"),
        ([BATCH_MAGIC, msgpack.packb([b"\x90"] * (MAX_BATCH + 1))], "at most"),
        ([BATCH_MAGIC, msgpack.packb([b"\x90", [b"\x90"]])], "other than headers"),
        ([BATCH_MAGIC, msgpack.packb([b"\x90", "\x90"])], "other than headers"),  # a str
        ([BATCH_MAGIC, msgpack.packb([b"\x90"]) + b"\x90"], "bytes after"),
        ([BATCH_MAGIC, msgpack.packb([b"\x90", b"abc"])[:-1]], "3 bytes, 2 there"),  # cut short
        ([BATCH_MAGIC, b"\x91\xc5\x00"], "other than headers"),  # a bin16 head cut short
        ([BATCH_MAGIC, b""], "no array"),
        ([BATCH_MAGIC, b"\x90", b"\x90"], "magic and one frame"),  # version 3's shape
    ],
)
def test_an_empty_oversized_or_nested_batch_is_refused(frames: list[bytes], why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        split_batch(frames)


def test_a_sender_never_builds_an_empty_or_oversized_batch() -> None:
    for count in (0, MAX_BATCH + 1):
        with pytest.raises(ValueError, match="a batch holds"):
            batch_frames([b"\x90"] * count)
    assert len(to_wire(batch_frames([b"\x90"] * MAX_BATCH))) == 1  # one frame on the wire


def test_coalesce_keeps_the_order_and_sends_a_large_message_alone_in_place() -> None:
    small = [encode(Heartbeat(rank=i)) for i in range(6)]
    large = encode(Exec("s", "big", "d", (0,), {0: [Lit(np.zeros(50_000))]}))
    assert len(large) > 2  # a buffer frame: it may not ride in a batch
    batchable = [True, True, True, True, False, True, True]
    plan = coalesce(zip([small[0], small[1], large, *small[2:]], batchable, strict=True))
    assert [carried for _, carried in plan] == [2, 1, 1, 1, 2]
    assert plan[0][0] == batch_frames([small[0][1], small[1][1]])
    assert plan[1][0] is large and plan[2][0] is small[2] and plan[3][0] is small[3]
    assert plan[4][0] == batch_frames([small[4][1], small[5][1]])
    many = coalesce([(small[0], True)] * (MAX_BATCH + 3))
    assert [carried for _, carried in many] == [MAX_BATCH, 3]


# -- the broker's shell, turned by hand over inproc (deterministic) -------------------------


class Raw:
    """A raw DEALER speaking the wire by hand; ``got`` counts the ZeroMQ messages."""

    def __init__(self, ctx: zmq.Context[Any], address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.got = 0

    def send(self, msg: Record) -> None:
        self.sock.send_multipart(to_wire(encode(msg)))

    def send_batch(self, msgs: Sequence[Record]) -> None:
        self.sock.send_multipart(to_wire(batch_frames([_header(m) for m in msgs])))

    def messages(self, timeout: float) -> Iterator[tuple[list[bytes], Record]]:
        """What arrives within ``timeout`` (each batch's messages one by one), with the
        ZeroMQ message it came in."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                return
            frames = from_wire(self.sock.recv_multipart())
            self.got += 1
            for one in split_batch(frames) if is_batch(frames) else [frames]:
                yield frames, decode(one, unpickle=False)

    def wait_for(self, kind: type[Record], timeout: float = 10.0) -> tuple[Record, list[bytes]]:
        for frames, msg in self.messages(timeout):
            if isinstance(msg, kind):
                return msg, frames
        raise AssertionError(f"no {kind.__name__} in time")


def _program(world: int) -> Any:
    b = GraphBuilder(world)
    x = b.input((0,))
    c = b.op("constant", [], ranks=tuple(range(world)), value=1)[0]
    return b.build([c, x])


def test_the_broker_batches_per_peer_and_keeps_the_order_around_a_large_exec() -> None:
    """With a job in flight, three Execs queued together, the middle one carrying a large
    input: rank 0 gets the
    first as one message, the large one alone after it, then the third (never before the
    large one); rank 1 (no large input for it) gets all three as one batch, in order."""
    ctx: zmq.Context[Any] = zmq.Context()
    broker = Broker(ClusterSpec.simple(2), "inproc://batch-order", context=ctx)
    broker.router.setsockopt(zmq.RCVTIMEO, 20)
    socks: list[Raw] = []

    def raw() -> Raw:
        socks.append(Raw(ctx, broker.address))
        return socks[-1]

    def serve_until(sock: Raw, kind: type[Record]) -> Record:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            broker._turn(math.inf)
            for _, msg in sock.messages(0.01):
                if isinstance(msg, kind):
                    return msg
        raise AssertionError(f"no {kind.__name__}")

    try:
        workers = [raw(), raw()]
        for rank, w in enumerate(workers):
            w.send(WorkerHello(rank, f"i{rank}", 1, "h", f"tcp://127.0.0.1:{rank + 9}", ""))
            serve_until(w, Welcome)
        driver = raw()
        driver.send(OpenSession(1, "", 60.0, "order"))
        opened = serve_until(driver, SessionOpened)
        assert isinstance(opened, SessionOpened)
        graph = _program(2)
        driver.send(Program(graph.digest, graph))
        sid = opened.session

        def job(name: str, value: Any) -> Exec:
            return Exec(sid, name, graph.digest, (0, 1), {0: [Lit(value)], 1: [None]}, (0,))

        driver.send(job("zero", 0))  # in flight: the broker reads what queues behind it
        serve_until(workers[1], Exec)
        driver.send(job("first", 1))
        driver.send(job("large", np.arange(50_000.0)))
        driver.send(job("third", 3))
        for w in workers:  # the program, sent before its first Exec, is not counted here
            w.got = 0
        broker._turn(math.inf)  # inproc: all three were queued at the broker already
        seen: list[list[tuple[str, bool]]] = [[], []]
        for rank, w in enumerate(workers):
            for frames, msg in w.messages(0.5):
                if isinstance(msg, Exec) and msg.job != "zero":
                    seen[rank].append((msg.job, is_batch(frames)))
        assert seen[0] == [("first", False), ("large", False), ("third", False)]
        assert seen[1] == [("first", True), ("large", True), ("third", True)]
        assert broker.state.counters["batches_sent"] >= 1
    finally:
        for s in socks:
            s.sock.close(linger=0)
        broker.close()
        ctx.term()


# -- batches from raw sockets against a real broker (plaintext, loopback) -------------------


@pytest.fixture
def rig() -> Iterator[tuple[Broker, Any]]:
    """A broker for 2 ranks on a free loopback port, and a maker of raw sockets on it."""
    with raw_broker(2, Raw) as pair:
        yield pair


def _status(driver: Raw, req: int) -> dict[str, Any]:
    driver.send(StatusRequest(req))
    for _, msg in driver.messages(10):
        if isinstance(msg, Reply) and msg.req == req:
            assert isinstance(msg.value, dict)
            return msg.value
    raise AssertionError("no status")


def _still_serves(driver: Raw, workers: list[Raw], sid: str, digest: str, name: str) -> None:
    """A job still runs: both ranks get its Exec, and their Dones make its result."""
    driver.send(Exec(sid, name, digest, (0, 1), {}, (0,)))
    for rank, w in enumerate(workers):
        exe, _ = w.wait_for(Exec)
        assert isinstance(exe, Exec) and exe.job == name
        w.send(Done(sid, name, rank, {0: 1}))
    result, _ = driver.wait_for(JobResult)
    assert isinstance(result, JobResult) and result.job == name and result.error is None


def test_a_driver_batch_of_execs_comes_back_as_one_batch_of_results(
    rig: tuple[Broker, Any],
) -> None:
    """Five Execs in one message reach each worker as one message; each worker's five
    Dones in one message come back to the driver as batched JobResults, each job's own."""
    _, raw = rig
    workers = joined_workers(raw, 2)
    driver, sid, digest = session_with_program(raw, "batch", 2, (0, 1))
    names = [f"job{i}" for i in range(5)]
    driver.send_batch([Exec(sid, n, digest, (0, 1), {}, (0,)) for n in names])
    for rank, w in enumerate(workers):
        got: list[str] = []
        carriers: set[int] = set()  # the ZeroMQ messages that held them
        for frames, msg in w.messages(10):
            if isinstance(msg, Exec):
                got.append(msg.job)
                carriers.add(id(frames))
            if len(got) == 5:
                break
        assert got == names and len(carriers) == 1
        w.send_batch([Done(sid, n, rank, {0: rank + 10}) for n in names])
    results: list[JobResult] = []
    carriers = set()
    for frames, msg in driver.messages(10):
        if isinstance(msg, JobResult):
            results.append(msg)
            carriers.add(id(frames))
        if len(results) == 5:
            break
    assert [r.job for r in results] == names
    assert all(r.error is None and r.values == {0: {0: 10, 1: 11}} for r in results)
    assert len(carriers) == 1  # rank 1's batch ended all five in one wake-up
    status = _status(driver, 2)
    assert status["batches_received"] == 3 and status["batches_sent"] >= 3


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        ([BATCH_MAGIC + msgpack.packb([])], "an empty batch"),
        ([BATCH_MAGIC + msgpack.packb([_header(Heartbeat())] * 65)], "a batch of 65"),
        ([BATCH_MAGIC + msgpack.packb([_HB, [_HB]])], "other than headers"),
        ([BATCH_MAGIC, _HB, _HB], "its magic and one frame"),  # version 3's shape
    ],
)
def test_a_bad_batch_is_refused_as_one_bad_message_and_the_broker_still_serves(
    rig: tuple[Broker, Any], wire: list[bytes], why: str
) -> None:
    _, raw = rig
    workers = joined_workers(raw, 2)
    driver, sid, digest = session_with_program(raw, "batch", 2, (0, 1))
    before = _status(driver, 2)
    driver.sock.send_multipart(wire)
    refused, _ = driver.wait_for(Refused)
    assert isinstance(refused, Refused) and why in refused.error.message
    assert refused.error.kind == "ProtocolError"
    after = _status(driver, 3)
    assert after["protocol_errors"] == before["protocol_errors"] + 1
    assert after["batches_refused"] == 1 and after["batches_received"] == 0
    _still_serves(driver, workers, sid, digest, "after")
    assert _status(driver, 4)["jobs_done"] == before["jobs_done"] + 1


def test_garbage_inner_headers_are_each_refused_as_alone_and_the_rest_handled(
    rig: tuple[Broker, Any],
) -> None:
    _, raw = rig
    workers = joined_workers(raw, 2)
    driver, sid, digest = session_with_program(raw, "batch", 2, (0, 1))
    before = _status(driver, 2)
    garbage = [b"\xc1", msgpack.packb(["exec", "not", "an", "exec"]), b"\x91\xa4done"]
    driver.sock.send_multipart(to_wire(batch_frames([*garbage, _header(StatusRequest(3))])))
    refusals = 0
    for _, msg in driver.messages(10):
        if isinstance(msg, Refused):
            assert msg.error.kind == "ProtocolError"
            refusals += 1
        if isinstance(msg, Reply) and msg.req == 3:  # the good one, handled after them
            break
    assert refusals == 3
    after = _status(driver, 4)
    assert after["protocol_errors"] == before["protocol_errors"] + 3
    assert after["batches_received"] == 1
    _still_serves(driver, workers, sid, digest, "after")


def test_a_batched_done_for_another_rank_is_dropped_as_alone(rig: tuple[Broker, Any]) -> None:
    """Rank 0's socket batches a forged Done for rank 1 with its own: the forgery is counted
    and dropped, rank 0's own counts, and the job waits for rank 1's genuine answer."""
    _, raw = rig
    workers = joined_workers(raw, 2)
    driver, sid, digest = session_with_program(raw, "batch", 2, (0, 1))
    driver.send(Exec(sid, "victim", digest, (0, 1), {}, (0,)))
    for w in workers:
        w.wait_for(Exec)
    workers[0].send_batch([Done(sid, "victim", 1, {0: "forged"}), Done(sid, "victim", 0, {0: 0})])
    assert [m for _, m in driver.messages(0.3) if isinstance(m, JobResult)] == []
    workers[1].send(Done(sid, "victim", 1, {0: "genuine"}))
    result, _ = driver.wait_for(JobResult)
    assert isinstance(result, JobResult) and result.error is None
    assert result.values == {0: {0: 0, 1: "genuine"}}
    assert _status(driver, 2)["forged_replies"] == 1


def _kind(msg: Record) -> str:
    error = getattr(msg, "error", None)
    return str(getattr(error, "kind", ""))


def test_a_worker_batching_execs_gets_what_each_exec_alone_gets(rig: tuple[Broker, Any]) -> None:
    """A worker may not run jobs: a batch of Execs from its socket is answered exactly as
    the same Execs sent one by one, and no rank gets an Exec from it."""
    _, raw = rig
    workers = joined_workers(raw, 2)
    driver, sid, digest = session_with_program(raw, "batch", 2, (0, 1))

    def answers(send: Any) -> list[tuple[str, str]]:
        send()
        got = [(m.TAG, _kind(m)) for _, m in workers[0].messages(0.5)]
        return [a for a in got if a[0] not in ("hb", "directory")]

    execs = [Exec(sid, f"w{i}", digest, (0, 1), {}, (0,)) for i in range(3)]

    def one_by_one() -> None:
        for e in execs:
            workers[0].send(e)

    alone = answers(one_by_one)
    batched = answers(lambda: workers[0].send_batch(execs))
    assert alone and batched == alone
    assert [m.TAG for _, m in workers[1].messages(0.2) if isinstance(m, Exec)] == []
    _still_serves(driver, workers, sid, digest, "after")


# -- a real worker given batches by a fake broker ------------------------------------------


class FakeBroker:
    """A ROUTER that welcomes one worker, sends it messages and records its answers."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self.router = configure(ctx.socket(zmq.ROUTER), linger_ms=0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.peer: bytes | None = None
        self.dones: list[Done] = []
        self.done_messages = 0  # ZeroMQ messages that carried Dones
        self.stats: dict[str, Any] = {}  # the worker's, from its last heartbeat

    def pump(self, timeout_ms: int) -> None:
        while self.router.poll(timeout_ms):
            timeout_ms = 0
            who, *wired = self.router.recv_multipart()
            frames = from_wire(wired)
            inner = split_batch(frames) if is_batch(frames) else [frames]
            msgs = [decode(one) for one in inner]
            if any(isinstance(m, WorkerHello) for m in msgs):
                self.peer = who
            for m in msgs:
                if isinstance(m, Heartbeat) and m.stats:
                    self.stats = m.stats
            dones = [m for m in msgs if isinstance(m, Done)]
            self.dones += dones
            self.done_messages += bool(dones)

    def start_worker(self, tmp_path: Any) -> subprocess.Popen[bytes]:
        """A real ``mpl-worker`` process of rank 0 dialling this broker (the caller stops it
        by its pid)."""
        cmd = [*daemon_command("mpl-worker"), "--broker", self.address, "--rank", "0"]
        cmd += ["--data-root", str(tmp_path / "data")]
        return subprocess.Popen(cmd, cwd=tmp_path, stderr=subprocess.DEVNULL)

    def send(self, frames: list[Any]) -> None:
        """Send a message in the codec's form."""
        self.send_wire(to_wire(frames))

    def send_wire(self, frames: list[Any]) -> None:
        """Send frames as they are (a hostile broker's)."""
        assert self.peer is not None
        self.router.send_multipart([self.peer, *frames])

    def welcome(self, heartbeat_s: float, timeout: float) -> None:
        """Wait for the worker's hello (at most ``timeout`` seconds), then welcome it."""
        deadline = time.monotonic() + timeout
        while self.peer is None:
            assert time.monotonic() < deadline, "the worker never said hello"
            self.pump(50)
        self.send(encode(Welcome(0, 1, "fake-broker", heartbeat_s, {})))

    def wait_dones(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.dones) < count:
            assert time.monotonic() < deadline, f"{len(self.dones)} of {count} Dones"
            self.pump(50)


@pytest.fixture
def fake() -> Iterator[tuple[FakeBroker, Worker]]:
    ctx: zmq.Context[Any] = zmq.Context()
    broker = FakeBroker(ctx)
    worker = Worker(broker.address, 0, context=ctx, heartbeat_s=0.5).start()
    try:
        broker.welcome(0.5, 10)
        assert worker.joined.wait(10)
        yield broker, worker
    finally:
        worker.stop()
        worker.join(10)
        broker.router.close(linger=0)
        ctx.term()


def _one_rank_program() -> Any:
    b = GraphBuilder(1)
    return b.build(b.op("constant", [], ranks=(0,), value=5))


@contextlib.contextmanager
def worker_process(tmp_path: Any) -> Iterator[tuple[FakeBroker, subprocess.Popen[bytes], Any]]:
    """A real ``mpl-worker`` process welcomed by a :class:`FakeBroker` (heartbeats every
    0.2 s) and sent :func:`_one_rank_program`: the broker, the process and the program,
    the process stopped by its pid at the end."""
    ctx: zmq.Context[Any] = zmq.Context()
    broker = FakeBroker(ctx)
    proc = broker.start_worker(tmp_path)
    try:
        broker.welcome(0.2, 20)
        graph = _one_rank_program()
        broker.send(encode(Program(graph.digest, graph)))
        yield broker, proc, graph
    finally:
        proc.terminate()
        proc.wait(10)
        broker.router.close(linger=0)
        ctx.term()


def wait_protocol_errors(broker: FakeBroker, count: int, what: str) -> None:
    """Wait until the worker's heartbeat counts ``count`` bad messages."""

    def counted() -> bool:
        broker.pump(50)
        return broker.stats.get("protocol_errors") == count

    wait_until(counted, 20, f"{what} counted in a heartbeat")


def test_a_worker_answers_a_batch_of_execs_with_batched_dones(
    fake: tuple[FakeBroker, Worker],
) -> None:
    broker, worker = fake
    graph = _one_rank_program()
    broker.send(encode(Program(graph.digest, graph)))
    for i in range(3):  # its first runs make the program a quick one (run inline after)
        broker.send(encode(Exec("s", f"warm{i}", graph.digest, (0,), {}, (0,))))
        broker.wait_dones(i + 1)
    shared = False
    for attempt in range(5):  # a run slower than 1 ms (a busy machine) sends it to the pool
        names = [f"job{attempt}.{i}" for i in range(8)]
        broker.done_messages, seen = 0, len(broker.dones)
        frames = batch_frames([_header(Exec("s", n, graph.digest, (0,), {}, (0,))) for n in names])
        broker.send(frames)
        broker.wait_dones(seen + len(names))
        assert [d.job for d in broker.dones[seen:]] == names
        assert all(d.values == {0: 5} for d in broker.dones[seen:])
        if broker.done_messages < len(names):  # several Dones shared a message
            shared = True
            break
    assert shared and worker.stats()["jobs_inline"] >= 1


@pytest.mark.parametrize(
    "frames",
    [
        [BATCH_MAGIC + msgpack.packb([])],
        [BATCH_MAGIC + msgpack.packb([_HB] * (MAX_BATCH + 1))],
        [BATCH_MAGIC + msgpack.packb([_HB, [_HB]])],
        [BATCH_MAGIC, _HB, _HB],
        [BATCH_MAGIC],
    ],
    ids=["empty", "oversized", "nested", "version-3-shape", "magic-alone"],
)
def test_a_worker_drops_a_bad_batch_as_one_bad_message_and_still_serves(
    fake: tuple[FakeBroker, Worker], frames: list[bytes]
) -> None:
    broker, worker = fake
    before = worker.stats()["protocol_errors"]
    graph = _one_rank_program()
    broker.send(encode(Program(graph.digest, graph)))
    broker.send_wire(frames)
    broker.send(encode(Exec("s", "after", graph.digest, (0,), {}, (0,))))
    broker.wait_dones(1)
    assert broker.dones[0].job == "after" and broker.dones[0].values == {0: 5}
    assert worker.stats()["protocol_errors"] == before + 1


def test_a_worker_drops_each_garbage_inner_header_and_runs_the_good_one(
    fake: tuple[FakeBroker, Worker],
) -> None:
    broker, worker = fake
    before = worker.stats()["protocol_errors"]
    graph = _one_rank_program()
    broker.send(encode(Program(graph.digest, graph)))
    good = _header(Exec("s", "good", graph.digest, (0,), {}, (0,)))
    broker.send(batch_frames([b"\xc1", msgpack.packb(["exec", 1]), good]))
    broker.wait_dones(1)
    assert broker.dones[0].job == "good"
    wait_until(lambda: worker.stats()["protocol_errors"] == before + 2, what="two refusals")


# -- the hot path with jobs in flight: in-process and with real daemons -------------------


class CountingSocket:
    """Wraps the broker's ROUTER and counts the ZeroMQ messages through it (the shell
    takes pyzmq's own calls on anything that is not a compiled socket)."""

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self.sock = sock
        self.sent = 0
        self.received = 0

    def send_multipart(self, frames: Any, flags: int = 0, copy: bool = True) -> None:
        self.sock.send_multipart(frames, flags, copy=copy)
        self.sent += 1

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> Any:
        frames = self.sock.recv_multipart(flags, copy=copy)
        self.received += 1
        return frames

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@mp.function
def trivial() -> mp.Value:
    out: mp.Value = mp.device("P0")(lambda: 1)()
    return out


def _windowed(jobs: int, window: int) -> None:
    inflight: list[Any] = []
    for _ in range(jobs):
        if len(inflight) >= window:
            assert mp.fetch(inflight.pop(0).result(timeout=30)) == 1
        inflight.append(mp.submit(trivial))
    for f in inflight:
        assert mp.fetch(f.result(timeout=30)) == 1


def test_64_in_flight_take_well_under_four_messages_per_job_in_process() -> None:
    """Each job is an Exec in and out of the broker and a Done in and a JobResult out: four
    ZeroMQ messages through the broker's socket when each goes alone."""
    sim: Simulator = mp.Simulator.simple(2)
    try:
        with sim:
            broker = sim.runtime.broker
            _windowed(8, 1)  # programs sent, the job quick on rank 0
            counting = CountingSocket(broker.router)
            broker.router = counting  # type: ignore[assignment]
            try:
                jobs = 3 * 64
                _windowed(jobs, 64)
                per_job = (counting.sent + counting.received) / jobs
            finally:
                broker.router = counting.sock
            assert per_job < 3, f"{per_job:.2f} ZeroMQ messages per job at the broker"
            assert sim.status()["batches_sent"] >= 1
    finally:
        sim.close()


def test_64_in_flight_with_real_daemons_ride_in_batches(tmp_path: Any) -> None:
    with mp.local_cluster(2, run_dir=tmp_path) as ctx:
        _windowed(8, 1)
        before = ctx.status()
        _windowed(3 * 64, 64)
        after = ctx.status()
    assert after["jobs_done"] - before["jobs_done"] == 3 * 64
    assert after["batches_sent"] > before["batches_sent"]
    assert after["batches_received"] > before["batches_received"]
    assert after["protocol_errors"] == before["protocol_errors"]


def test_a_sync_call_finds_its_answer_inside_a_batch() -> None:
    """A thread's own socket (``Client._call``) may be sent a batch too (its answer queued
    at the broker with a late one): it reads each inner answer as if alone and returns its
    own."""
    from concurrent.futures import ThreadPoolExecutor

    from mpl.driver.client import Client

    ctx: zmq.Context[Any] = zmq.Context()
    router = configure(ctx.socket(zmq.ROUTER), linger_ms=0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = Client(f"tcp://127.0.0.1:{port}", context=ctx, timeout=10)
    pool = ThreadPoolExecutor(1)
    try:
        asked = Exec("s", "mine", "d", (0,), {})
        call = pool.submit(
            client._call, asked, lambda m: isinstance(m, JobResult) and m.job == "mine", 10, "t"
        )
        deadline = time.monotonic() + 10
        while True:  # the heartbeat socket says hello too: answer the one that sent the Exec
            assert time.monotonic() < deadline and router.poll(10_000), "no Exec arrived"
            who, *frames = router.recv_multipart()
            if decode(from_wire(frames), unpickle=False) == asked:
                break
        answers = [JobResult("late", {0: {0: 1}}), JobResult("mine", {0: {0: 2}})]
        router.send_multipart([who, *to_wire(batch_frames([_header(a) for a in answers]))])
        got = call.result(timeout=10)
        assert isinstance(got, JobResult) and got.job == "mine" and got.values == {0: {0: 2}}
    finally:
        pool.shutdown(wait=True)
        client.close()
        router.close(linger=0)
        ctx.term()


def test_64_in_flight_in_secure_mode_ride_in_batches(tmp_path: Any) -> None:
    """Under CURVE each inner message counts as sent by the key its batch arrived with:
    the workers' batched Dones are taken as their ranks' own, the sealed results open."""
    from deployment import Deployment

    from mpl.broker.query import StatusProbe
    from mpl.wire.curve import Curve
    from mpl.wire.keys import load_keypair

    d = Deployment(tmp_path)
    try:
        d.start_broker()
        for rank in range(2):
            d.start_worker(rank)
        analyst = Curve(load_keypair(d.key("analyst")), d.spec)

        def status() -> dict[str, Any]:
            with StatusProbe(d.address, curve=analyst) as probe:
                return dict(probe.ask(2.0))

        wait_until(lambda: all(r["state"] == "up" for r in status()["ranks"]), 20, "ranks up")
        ctx = mp.connect(d.address, key=d.key("analyst"), cluster=d.cluster_file)
        try:
            with ctx:
                _windowed(8, 1)
                before = status()
                _windowed(3 * 64, 64)
                after = status()
        finally:
            ctx.close()
        assert after["jobs_done"] - before["jobs_done"] == 3 * 64
        assert after["batches_received"] > before["batches_received"]
        assert after["batches_sent"] > before["batches_sent"]
        assert after["forged_replies"] == before["forged_replies"] == 0
        assert after["protocol_errors"] == before["protocol_errors"]
    finally:
        d.close()


class RecordingRouter:
    """Stands in for the broker's ROUTER in its shell's send path: keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def send_multipart(self, frames: Any, flags: int = 0, copy: bool = True) -> None:
        self.sent.append([bytes(f) for f in frames])


def test_only_execs_and_results_ride_in_batches_so_a_heartbeat_socket_never_gets_one() -> None:
    """The broker batches only the hot records: heartbeats, replies and programs queued for
    one peer go alone (the driver's heartbeat socket, which reads no batch, gets only
    those), while the Execs and JobResults beside them are coalesced in order."""
    from mpl.broker.actions import Send

    ctx: zmq.Context[Any] = zmq.Context()
    broker = Broker(ClusterSpec.simple(2), "inproc://batch-kinds", context=ctx)
    real = broker.router
    fake = RecordingRouter()
    try:
        broker.router = fake  # type: ignore[assignment]
        peer = b"\x00peer"
        execs = [Exec("s", f"j{i}", "d", (0,), {}) for i in range(2)]
        results = [JobResult(f"j{i}", {0: {0: i}}) for i in range(2)]
        queued: list[Record] = [Heartbeat(), Heartbeat(), *execs, Reply(1, value=2), *results]
        broker._perform([Send(peer, msg) for msg in queued])
        broker._flush()
        kinds = []
        for frames in fake.sent:
            assert frames[0] == peer
            body = from_wire(frames[1:])
            inner = split_batch(body) if is_batch(body) else [body]
            kinds.append([decode(one, unpickle=False).TAG for one in inner])
        assert kinds == [["hb"], ["hb"], ["exec", "exec"], ["reply"], ["result", "result"]]
    finally:
        broker.router = real
        broker.close()
        ctx.term()


def test_bad_batches_against_real_daemons_are_refused_and_they_still_serve(
    make_cluster: Any,
) -> None:
    """The same refusals from ``mpl-broker`` and ``mpl-worker`` processes: an empty, an
    oversized and a nested batch are one bad message each, garbage inner headers one each,
    a worker's-Execs batch from a stranger is refused per Exec; jobs still run."""
    from mpl.wire.jobs import output_uri

    cluster = make_cluster("tcp")
    owner = cluster.client()
    sid = owner.open_session("batches").session
    b = GraphBuilder(2)
    g = b.build([b.op("constant", [], ranks=(1,), value=[4, 2])[0]])
    before = owner.status()
    ctx: zmq.Context[Any] = zmq.Context()
    attacker = Raw(ctx, cluster.address)
    try:
        bad = [
            [BATCH_MAGIC + msgpack.packb([])],
            [BATCH_MAGIC + msgpack.packb([_HB] * (MAX_BATCH + 1))],
            [BATCH_MAGIC + msgpack.packb([_HB, [_HB]])],
            to_wire(batch_frames([b"\xc1", msgpack.packb(["exec", 1])])),
            # a stranger's Execs into another driver's session
            to_wire(
                batch_frames([_header(Exec(sid, f"x{i}", g.digest, (1,), {})) for i in range(2)])
            ),
        ]
        for frames in bad:
            attacker.sock.send_multipart(frames)
        refusals: list[Refused | JobResult] = []
        for _, msg in attacker.messages(10):
            if isinstance(msg, (Refused, JobResult)):
                refusals.append(msg)
            if len(refusals) == 3 + 2 + 2:
                break
        assert [type(m).__name__ for m in refusals] == ["Refused"] * 5 + ["JobResult"] * 2
        assert all(isinstance(m, Refused) or m.error is not None for m in refusals)
        after = owner.status()
        assert after["protocol_errors"] == before["protocol_errors"] + 5
        assert after["batches_refused"] == 3 and after["batches_received"] == 2
        assert after["jobs_in_flight"] == 0
        job = owner.submit(sid, g, {}).job  # the daemons still serve
        assert owner.fetch(sid, 1, output_uri(job, 0)) == [4, 2]
        assert all(r["state"] == "up" for r in owner.status()["ranks"])
    finally:
        attacker.sock.close(linger=0)
        ctx.term()


def test_a_worker_process_drops_bad_batches_and_still_serves(tmp_path: Any) -> None:
    with worker_process(tmp_path) as (broker, proc, graph):
        good = _header(Exec("s", "good", graph.digest, (0,), {}, (0,)))
        for frames in (
            [BATCH_MAGIC + msgpack.packb([])],
            [BATCH_MAGIC + msgpack.packb([_HB] * (MAX_BATCH + 1))],
            [BATCH_MAGIC + msgpack.packb([good, [good]])],
            to_wire(batch_frames([b"\xc1", good])),
        ):
            broker.send_wire(frames)
        broker.wait_dones(1)
        assert [d.job for d in broker.dones] == ["good"] and broker.dones[0].values == {0: 5}
        wait_protocol_errors(broker, 4, "four bad messages")
        assert proc.poll() is None


def test_gathered_dones_go_before_a_job_handed_to_the_pool(
    fake: tuple[FakeBroker, Worker],
) -> None:
    """A batch runs a quick job inline, then hands a new program's job to the pool, then
    runs more quick jobs: the inline job's Done is sent before the pooled job can answer,
    so answers leave in the order their jobs began."""
    broker, _worker = fake
    b = GraphBuilder(1)
    # quick (under 1 ms), yet slow enough that the pool answers while the rest run inline
    quick = b.build(b.op("pcall", [], ranks=(0,), fn=b.fn(nap_then), args=(5, 0.0004)))
    b = GraphBuilder(1)
    fresh = b.build(b.op("constant", [], ranks=(0,), value=6))  # first run: on the pool
    for graph in (quick, fresh):
        broker.send(encode(Program(graph.digest, graph)))
    for i in range(3):
        broker.send(encode(Exec("w", f"warm{i}", quick.digest, (0,), {}, (0,))))
        broker.wait_dones(i + 1)
    execs = [Exec("s1", "inline", quick.digest, (0,), {}, (0,))]
    execs.append(Exec("s2", "pooled", fresh.digest, (0,), {}, (0,)))
    execs += [Exec(f"t{i}", f"after{i}", quick.digest, (0,), {}, (0,)) for i in range(12)]
    broker.send(batch_frames([_header(e) for e in execs]))
    broker.wait_dones(3 + len(execs))
    order = [d.job for d in broker.dones[3:]]
    assert order.index("inline") < order.index("pooled"), order
