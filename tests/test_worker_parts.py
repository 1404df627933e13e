"""The worker's pure parts: joining in the state machine, the mailbox, and the interpreter."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from helpers import blocked_in_wait, wait_until

from mpl.wire import Graph, GraphBuilder, JobAbortedError, MplTimeoutError
from mpl.wire.control import (
    Bye,
    Directory,
    Heartbeat,
    PeerInfo,
    Refused,
    Reregister,
    Welcome,
    WorkerHello,
)
from mpl.wire.jobs import Program
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SymbolInfo
from mpl.worker.interpreter import ABSENT, Plan, run_graph
from mpl.worker.keyed_mailbox import move_mailbox, spu_mailbox
from mpl.worker.state import PROGRAM_SLOTS, WorkerState
from mpl.worker.state_events import Beat, CloseAll, Joined, Reconnect, Send, Stop, Tick
from mpl.worker.store import ObjectStore


def core() -> WorkerState:
    return WorkerState(WorkerHello(1, "inc", 1, "h", "tcp://d", ""), now=0.0, heartbeat_s=1.0)


def welcome(broker: str = "B") -> Welcome:
    return Welcome(1, 2, broker, 1.0, {})


def test_hello_is_resent_with_capped_backoff_until_welcome() -> None:
    c = core()
    times = [t / 10 for t in range(0, 100)]
    hellos = [t for t in times if c.handle(Tick(), t)]
    gaps = [b - a for a, b in itertools.pairwise(hellos)]
    assert gaps[0] < gaps[-1] <= 2.05
    actions = c.handle(welcome(), 10.0)
    assert actions == [CloseAll("the broker restarted"), Joined("B", True)]
    assert c.handle(welcome(), 10.5) == [Joined("B", False)]


def test_heartbeats_then_reconnect_when_the_broker_goes_silent() -> None:
    c = core()
    c.handle(welcome(), 0.0)
    beats = [a for t in (0.5, 1.0, 1.5, 2.0) for a in c.handle(Tick(), t)]
    assert beats == [Beat()] * 2  # at 0.5 (due since the welcome) and at 1.5
    c.handle(Heartbeat(), 2.0)
    assert not any(isinstance(a, Reconnect) for a in c.handle(Tick(), 4.9))
    assert isinstance(c.handle(Tick(), 5.1)[0], Reconnect)
    rejoin = c.handle(Tick(), 5.2)[0]
    assert isinstance(rejoin, Send) and isinstance(rejoin.msg, WorkerHello)


def test_reregister_bye_and_refusal() -> None:
    c = core()
    c.handle(welcome(), 0.0)
    out = c.handle(Reregister("B2"), 1.0)
    assert isinstance(out[0], Send) and isinstance(out[0].msg, WorkerHello)
    c.handle(welcome("B2"), 1.1)
    c.handle(Bye("restart"), 2.0)
    assert not c.joined
    fresh = core()
    stop = fresh.handle(Refused(ErrorInfo("RegistrationError", "taken")), 0.0)
    assert isinstance(stop[0], Stop) and stop[0].error.message == "taken"


def test_directory_and_program_cache_lru() -> None:
    c = core()
    c.handle(Directory({0: PeerInfo(0, "i", "tcp://a", "")}), 0.0)
    assert c.directory[0].data_addr == "tcp://a"
    graphs = [Graph(1, (), (), (), name=f"g{i}") for i in range(PROGRAM_SLOTS + 5)]
    for g in graphs:
        c.handle(Program(g.digest, g), 0.0)
    assert c.program(graphs[0].digest) is None and c.program(graphs[-1].digest) is not None


KEY = ("s", "j", 3, 0, 0, "")


def test_mailbox_delivers_once_in_any_order() -> None:
    box = move_mailbox()
    box.open(("s", "j"))
    assert box.put(KEY, "early")  # before anyone waits
    assert not box.put(KEY, "dup")
    assert box.take(KEY, time.monotonic() + 1, "late") == "early"
    assert not box.put(KEY, "after take")
    got: list[Any] = []
    late = ("s", "j", 4, 0, 1, "")
    t = threading.Thread(target=lambda: got.append(box.take(late, time.monotonic() + 5, "")))
    t.start()
    box.put(late, "late")
    t.join(5)
    assert got == ["late"] and box.duplicates == 2
    box.end(("s", "j"))
    assert not box.put(("s", "j", 9, 0, 0, ""), "for an ended job") and box.late == 1


def test_mailbox_abort_wakes_waiters_and_deadline_is_bounded() -> None:
    box = move_mailbox()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            box.take(KEY, time.monotonic() + 60, "never")
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    blocked_in_wait(t)  # the take sleeps until its deadline unless something wakes it
    box.close(("s", "j"), "rank 0 failed")
    t.join(30)  # the close woke it: its deadline is 60 s away, and would raise a timeout
    assert not t.is_alive()
    assert isinstance(errors[0], JobAbortedError) and "rank 0 failed" in str(errors[0])
    with pytest.raises(MplTimeoutError, match="did not arrive in time"):
        box.take(("s", "k", 1, 0, 1, ""), time.monotonic() + 0.05, "did not arrive in time")


class FakeJob:
    session, job, deadline = "s", "j", 0.0

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.spans: list[list[Any]] = []
        self.sent: list[tuple[int, int, Any]] = []
        self.progress: list[tuple[int, int, int]] = []

    # every op's start is due for a report: the fake records each position
    started, next_report = 0.0, float("-inf")
    position: tuple[int, int, Any, int] | None = None
    # declared for JobContext only: the graphs run here neither save nor load
    store: ObjectStore
    saved: list[SymbolInfo]
    sealer = ""

    def report(self, now: float) -> None:
        assert self.position is not None
        done, total, _, index = self.position
        self.progress.append((done, total, index))

    def send(self, dst: int, op: int, seq: int, value: Any) -> None:
        self.sent.append((dst, op, value))

    def recv(self, src: int, op: int, seq: int) -> Any:
        return f"from {src}"

    def extension(self, name: str) -> Any:
        raise KeyError(name)


def test_interpreter_runs_only_this_ranks_ops_and_frees_intermediates() -> None:
    b = GraphBuilder(2)
    x = b.input((0,))
    y = b.op("pcall", [x], ranks=(0,), fn=b.fn(lambda v: v + 1))[0]
    z = b.op("shuffle", [y], ranks=(0, 1), routing={1: 0, 0: 0})[0]
    w = b.op("pcall", [z], ranks=(1,), fn=b.fn(str.upper))[0]
    g = b.build([z, w])
    plan = Plan.build(g, 0)
    assert 1 in plan.free_after[1]  # y is dropped after the shuffle reads it
    job = FakeJob(0)
    out = run_graph(plan, [41], job)
    assert out == [42, ABSENT]
    assert job.sent == [(1, 1, 42)]
    assert job.progress == [(0, 2, 0), (1, 2, 1)]  # rank 0 runs ops 0 and 1 of the 3
    other = run_graph(Plan.build(g, 1), [ABSENT], FakeJob(1))
    assert other == ["from 0", "FROM 0"]


def test_a_wake_makes_waiters_ask_their_stop_callback_again() -> None:
    box = spu_mailbox()
    stops: dict[tuple[str, str], str] = {}
    errors: list[BaseException] = []
    key = ("s/SP0/t/0", 1, "k")

    def wait() -> None:
        try:
            box.take(key, time.monotonic() + 30, "never", stop=lambda: stops.get(("s", "j")))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    wait_until(lambda: "s/SP0/t/0" in box._open, what="the receive to wait")
    stops[("s", "j")] = "job j aborted: rank 1 was lost"  # what the state machine says
    box.wake()
    t.join(5)
    assert isinstance(errors[0], JobAbortedError) and "rank 1 was lost" in str(errors[0])
    assert box.put(key, b"late for the job, not the lane")  # the lane itself stays open
