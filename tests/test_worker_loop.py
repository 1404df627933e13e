"""The worker's I/O loop over real sockets: a fake broker (a ROUTER in the test) and a peer
(a PUSH in the test) talk to a real ``Worker`` on 127.0.0.1.

The I/O thread waits on the broker's socket alone and runs its timers when due, also while
messages stream in; peer moves have a thread of their own, so they reach the mailbox even
while the I/O thread is busy (an inline job, a slow handler)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
import zmq
from helpers import wait_until

from mpl.wire import GraphBuilder
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.control import Directory, Heartbeat, Welcome, WorkerHello
from mpl.wire.data import Move
from mpl.wire.jobs import Exec, Failed, Program
from mpl.wire.sockets import configure
from mpl.worker import daemon
from mpl.worker.daemon import Worker


class FakeBroker:
    """A ROUTER that welcomes one worker and records what it hears from it."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self.router = configure(ctx.socket(zmq.ROUTER), linger_ms=0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.heard: list[Any] = []
        self.peer: bytes | None = None  # the worker's I/O dealer (the one that said hello)

    def pump(self, timeout_ms: int = 0) -> None:
        while self.router.poll(timeout_ms):
            timeout_ms = 0
            who, *frames = self.router.recv_multipart()
            msg = decode(from_wire(frames))
            if isinstance(msg, WorkerHello):
                self.peer = who
            self.heard.append(msg)

    def send(self, msg: Any) -> None:
        assert self.peer is not None
        self.router.send_multipart([self.peer, *to_wire(encode(msg))])

    def welcome(self, heartbeat_s: float) -> None:
        deadline = time.monotonic() + 10
        while self.peer is None:
            assert time.monotonic() < deadline, "the worker never said hello"
            self.pump(50)
        self.send(Welcome(0, 2, "fake-broker", heartbeat_s, {}))

    def beats(self) -> int:
        return sum(isinstance(m, Heartbeat) for m in self.heard)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def broker(ctx: zmq.Context[Any]) -> Iterator[FakeBroker]:
    fake = FakeBroker(ctx)
    yield fake
    fake.router.close(linger=0)


def _started(ctx: zmq.Context[Any], broker: FakeBroker, heartbeat_s: float) -> Worker:
    worker = Worker(broker.address, 0, context=ctx, heartbeat_s=heartbeat_s).start()
    broker.welcome(heartbeat_s)
    assert worker.joined.wait(10), "the worker did not join the fake broker"
    return worker


def _stop(worker: Worker) -> None:
    worker.stop()
    worker.join(10)
    assert worker._thread is not None and not worker._thread.is_alive()


def _hold_timers(worker: Worker) -> tuple[threading.Event, threading.Event]:
    """Make the I/O thread's next timer run hang until ``release`` is set (at most 20 s);
    ``busy`` is set once it hangs there."""
    busy, release = threading.Event(), threading.Event()
    original = worker.jobs.report_progress

    def stuck() -> None:
        busy.set()
        release.wait(20)
        original()

    worker.jobs.report_progress = stuck  # type: ignore[method-assign]
    return busy, release


def test_heartbeats_go_out_while_broker_messages_stream_in(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    heartbeat_s = 0.05
    worker = _started(ctx, broker, heartbeat_s)
    try:
        broker.pump(0)
        before = broker.beats()
        sent = beats = 0
        deadline = time.monotonic() + 15.0
        # bursts faster than the worker handles them: its queue never runs dry, so its
        # receive never times out and only the check after each message sends heartbeats.
        # Counted, not timed: a loaded machine streams slower but must still see the beats.
        while sent <= 2000 or beats < 5:
            assert time.monotonic() < deadline, f"{beats} heartbeats while {sent} streamed in"
            for _ in range(50):
                broker.send(Directory({}))
            sent += 50
            broker.pump(0)
            beats = broker.beats() - before
            time.sleep(0.001)
        assert worker.state.joined, "the worker thought the broker silent while it streamed"
    finally:
        _stop(worker)


def test_a_move_reaches_the_mailbox_while_the_io_thread_is_busy(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    worker = _started(ctx, broker, heartbeat_s=0.05)
    busy, release = _hold_timers(worker)  # like a long inline job
    push = configure(ctx.socket(zmq.PUSH), linger_ms=0)
    try:
        assert busy.wait(10), "the timers never ran"
        worker.mailbox.open(("s1", "j1"))
        push.connect(worker.data_addr)
        push.send_multipart(to_wire(encode(Move("s1", "j1", 3, 0, 1, 0, 41.5))))
        got = worker.mailbox.take(("s1", "j1", 3, 0, 1, ""), time.monotonic() + 10, "no move")
        assert got == 41.5
        assert busy.is_set() and not release.is_set()  # delivered while the I/O thread hung
    finally:
        release.set()
        push.close(linger=0)
        _stop(worker)


def test_a_move_for_another_rank_is_counted_by_the_peer_thread(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    worker = _started(ctx, broker, heartbeat_s=0.05)
    push = configure(ctx.socket(zmq.PUSH), linger_ms=0)
    try:
        push.connect(worker.data_addr)
        push.send_multipart(to_wire(encode(Move("s1", "j1", 3, 0, 1, 5, 1.0))))  # dst 5, not us
        push.send_multipart([b"not mpl"])
        wait_until(lambda: worker.stats()["protocol_errors"] == 2, what="both refusals counted")
    finally:
        push.close(linger=0)
        _stop(worker)


def test_a_move_that_overtook_its_exec_survives_a_full_holding_area(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    """Forged moves fill the area where moves for unknown jobs wait; a genuine move that
    arrives before its Exec is handled gets a second chance once the Exec opened its job
    (a single thread handling both sockets took the queued Exec first)."""
    worker = _started(ctx, broker, heartbeat_s=0.05)
    busy, release = _hold_timers(worker)  # as if descheduled with the Exec queued
    push = configure(ctx.socket(zmq.PUSH), linger_ms=0)
    try:
        assert busy.wait(10), "the timers never ran"
        push.connect(worker.data_addr)
        for i in range(1074):  # more than the area takes (not past rank 1's second chances)
            push.send_multipart(to_wire(encode(Move("s1", f"forged{i}", 0, 0, 1, 0, b"x"))))
        wait_until(lambda: worker.mailbox.held_dropped >= 1074 - 1024, what="the area full")
        dropped = worker.mailbox.held_dropped
        push.send_multipart(to_wire(encode(Move("s1", "real", 3, 0, 1, 0, 7.5))))
        wait_until(lambda: worker.mailbox.held_dropped > dropped, what="the early move dropped")
        worker.mailbox.open(("s1", "real"))  # what handling the Exec does
        release.set()
        got = worker.mailbox.take(("s1", "real", 3, 0, 1, ""), time.monotonic() + 10, "lost")
        assert got == 7.5
    finally:
        release.set()
        push.close(linger=0)
        _stop(worker)


def test_only_a_move_sent_by_a_peer_can_fail_work_under_code_kernels(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    """Under ``--code kernels`` a refused message from the data socket may fail only the job
    of a move addressed here. A program or job record holding pickles, sent by whoever
    reaches the data port, is counted and dropped: it must not mark a program refused, nor
    fail a job, on the peer's word."""
    worker = Worker(broker.address, 0, context=ctx, heartbeat_s=0.05, code="kernels").start()
    broker.welcome(0.05)
    assert worker.joined.wait(10), "the worker did not join the fake broker"
    push = configure(ctx.socket(zmq.PUSH), linger_ms=0)
    try:
        b = GraphBuilder(1)
        graph = b.build([b.op("pcall", [], ranks=(0,), fn=b.fn(len), args=("x",))[0]])
        push.connect(worker.data_addr)
        push.send_multipart(to_wire(encode(Program("d-genuine", graph))))  # a pickled function
        pickled_input = Exec("s1", "j1", "d-genuine", (0,), {0: [Fraction(1, 3)]}, (), 5.0)
        push.send_multipart(to_wire(encode(pickled_input)))
        wait_until(lambda: worker.stats()["protocol_errors"] == 2, what="both refusals counted")
        assert "d-genuine" not in worker.state.refused_code
        broker.pump(200)
        assert not any(isinstance(m, Failed) for m in broker.heard)
    finally:
        push.close(linger=0)
        _stop(worker)


def _wakeups(thread: threading.Thread | None) -> int:
    """Times ``thread`` went to sleep and was woken (Linux counts them per thread)."""
    assert thread is not None and thread.native_id is not None
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no context switch count")


def test_an_idle_worker_sleeps_until_its_heartbeat(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    worker = Worker(broker.address, 0, context=ctx, heartbeat_s=1.0)
    turns = [0]
    turn = worker._turn

    def counted(next_timers: float) -> float:
        turns[0] += 1
        return turn(next_timers)

    worker._turn = counted  # type: ignore[method-assign]
    worker.start()
    broker.welcome(1.0)
    try:
        assert worker.joined.wait(10), "the worker did not join the fake broker"
        wait_until(lambda: worker._resting, what="the worker to rest")
        spu = worker.spu_links._thread
        before = (turns[0], _wakeups(spu), time.monotonic())
        time.sleep(2.0)  # the interval being measured, not a wait for a condition
        io_turns, spu_wakes = turns[0] - before[0], _wakeups(spu) - before[1]
        # counts per interval that actually went by (a loaded machine may sleep longer):
        # a heartbeat a second, a turn or two each, where a 100 ms timer made ten a second;
        # the SPU thread's idle poll a second, where its 10 ms poll made a hundred wake-ups.
        # A wake-up may count twice or three times there: once from its poll, once more for
        # each wait for the GIL that another thread holds (the I/O thread's heartbeat and its
        # stats, on a busy machine: 7 was seen in 2 s); a 10 ms poll still makes ~200
        intervals = (time.monotonic() - before[2]) / 1.0
        assert io_turns <= 2 * (intervals + 1), (io_turns, intervals)
        assert spu_wakes <= 3 * (intervals + 1), (spu_wakes, intervals)
    finally:
        _stop(worker)


def test_a_resting_worker_serves_metrics_and_stops_at_once(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    worker = _started(ctx, broker, heartbeat_s=30.0)  # its timers are 30 s away
    try:
        wait_until(lambda: worker._resting, what="the worker to rest")
        snapshot = worker.snapshots.get(timeout=10.0)
        assert snapshot is not None and "jobs_done" in snapshot
        broker.send(Directory({}))  # a message ends the rest; quiet again, it rests anew
        wait_until(lambda: worker._resting, what="the worker to rest again")
    finally:
        worker.stop()
        worker.join(10)  # a stop wakes it: no waiting for its timers
        assert worker._thread is not None and not worker._thread.is_alive()


def test_timers_between_quick_messages_wait_for_the_heartbeat(
    ctx: zmq.Context[Any], broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While messages stream in with nothing else about (as between the quick jobs of a
    stream: no job in flight), the timers are next due when the state says (a heartbeat
    away), not every 100 ms: each such run brought them nearer than the receive timeout
    set, which was then reset every 5 ms (a socket option call per reset, a few thousand
    instructions). Counted per heartbeat interval that went by, not timed."""
    heartbeat_s = 0.5
    worker = _started(ctx, broker, heartbeat_s)
    runs, resets = [0], [0]
    report = worker.jobs.report_progress

    def counted_report() -> None:  # once per run of the timers
        runs[0] += 1
        report()

    real_set = daemon._raw_set

    def counted_set(sock: Any, option: int, value: int) -> None:
        if sock is worker.dealer:
            resets[0] += 1
        real_set(sock, option, value)

    worker.jobs.report_progress = counted_report  # type: ignore[method-assign]
    monkeypatch.setattr(daemon, "_raw_set", counted_set)
    try:
        wait_until(lambda: runs[0] > 0, what="a first run of the timers")
        runs[0] = resets[0] = 0
        started = time.monotonic()
        # the interval being measured: 100 ms timers would run 20 times in it
        while time.monotonic() < started + 2.0:
            for _ in range(20):
                broker.send(Directory({}))
            broker.pump(0)
            time.sleep(0.001)
        periods = (time.monotonic() - started) / heartbeat_s + 1
        # per heartbeat interval: the heartbeat and the silence check; a reset every 5 ms
        # in the last 100 ms before them, and one once they ran
        assert runs[0] <= 2 * periods, (runs[0], periods)
        assert resets[0] <= 25 * periods, (resets[0], periods)
        assert worker.state.joined and broker.beats() > 0
    finally:
        worker.jobs.report_progress = report  # type: ignore[method-assign]
        _stop(worker)


def test_a_worker_serves_metrics_while_messages_stream_in(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    """Its timers a heartbeat away (30 s here) while quiet messages stream in, the worker
    still serves a metrics reader: the reader's wake has them run after the next
    message."""
    worker = _started(ctx, broker, heartbeat_s=30.0)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(worker.snapshots.get(timeout=10.0)))
    try:
        wait_until(lambda: worker._resting, what="the worker to rest")  # timers 30 s away
        deadline = time.monotonic() + 15.0
        while worker._resting:  # out of its rest: the stream's turns wait in the receive
            assert time.monotonic() < deadline, "the worker never left its rest"
            broker.send(Directory({}))
            broker.pump(0)
            time.sleep(0.002)
        reader.start()
        while reader.is_alive():
            assert time.monotonic() < deadline, "the reader never returned"
            broker.send(Directory({}))
            broker.pump(0)
            reader.join(0.002)
        assert got and got[0] is not None and "jobs_done" in got[0]
    finally:
        reader.join(15)
        _stop(worker)


def test_a_pooled_job_begun_while_the_timers_are_a_heartbeat_away_has_them_every_100_ms(
    ctx: zmq.Context[Any], broker: FakeBroker
) -> None:
    """A job handed to the pool by a message that came while the worker was quiet (its
    timers then a heartbeat away: 30 s here) brings them back to _POLL_MS, as work about
    should (its long ops' progress is reported from there), even while messages stream in
    so fast that the receive never times out. Review w31-rev-perf: they stayed a heartbeat
    away, and no timer ran in 10 s."""
    worker = _started(ctx, broker, heartbeat_s=30.0)
    runs = [0]
    report = worker.jobs.report_progress

    def counted_report() -> None:  # once per run of the timers
        runs[0] += 1
        report()

    worker.jobs.report_progress = counted_report  # type: ignore[method-assign]
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(1,), fn=b.fn(len), args=("x",))[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={0: 1})[0]  # rank 0 waits for rank 1
    graph = b.build([y])
    try:
        wait_until(lambda: worker._resting, what="the worker to rest")  # timers 30 s away
        runs[0] = 0
        broker.send(Program(graph.digest, graph))
        broker.send(Exec("s1", "j1", graph.digest, (0, 1), {}, (), 60.0))
        deadline = time.monotonic() + 10.0
        while runs[0] == 0:  # the stream: a message every few ms, no 100 ms without one
            assert time.monotonic() < deadline, "no timer ran while a pooled job was in flight"
            broker.send(Directory({}))
            broker.pump(0)
            time.sleep(0.002)
        assert ("s1", "j1") in worker.state.jobs  # (the job still waits for rank 1)
    finally:
        worker.jobs.report_progress = report  # type: ignore[method-assign]
        _stop(worker)
