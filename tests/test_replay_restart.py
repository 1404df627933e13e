"""A worker restarted on its rank remembers none of the Execs it ran: a hostile broker that
recorded a driver's early Execs hands them to the new process. Each Exec is sealed for the
process it was meant for (its public incarnation), so the new one refuses them all; the
driver learns the new incarnation (from the broker's ``SessionOpened``, or the worker's
own refusal) and its jobs run again after at most one refusal per client.

The workers are real ``mpl-worker`` processes, stopped by pid and started again; the broker
runs in this process, its ROUTER behind a tap that records and rewrites what it sends.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from deployment import Deployment
from helpers import wait_until
from test_sealed_broker import as_frames, as_record

import mpl.driver as mp
from mpl.broker.daemon import Broker
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.control import WorkerHello
from mpl.wire.curve import Curve
from mpl.wire.incarnation import public_incarnation
from mpl.wire.jobs import Done, Exec, Failed, Program
from mpl.wire.keys import load_keypair
from mpl.wire.record import Record
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC
from mpl.wire.sessions import OpenSession, SessionOpened

pytestmark = pytest.mark.daemons

Frames = list[Any]


class Tap:
    """The broker's ROUTER, recording what workers send it, and rewriting what it sends
    when ``alter`` says so (the decoded record in; records to send instead, or None)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.received: list[Record] = []
        self.alter: Callable[[Record], list[Record] | None] | None = None
        self.rank_of: Callable[[bytes], int] = lambda peer: 0  # a worker's rank, by peer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def recv_multipart(self, *args: Any, **kw: Any) -> Frames:
        frames: Frames = self._sock.recv_multipart(*args, **kw)
        try:
            msg = decode(from_wire([memoryview(f).tobytes() for f in frames[1:]]), unpickle=False)
        except Exception:  # the broker says why; the tap only records what it can read
            return frames
        if isinstance(msg, (Done, Failed)):
            self.received.append(msg)
        return frames

    def send_multipart(self, frames: Frames, *args: Any, **kw: Any) -> Any:
        frames = list(frames)
        if self.alter is not None:
            body = from_wire(frames[1:])  # the codec's form (mpl.wire.codec)
            if bytes(body[0]) == SEALED_EXEC_MAGIC:  # an Exec, its rank's box after it
                msg: Record = as_record(body, self.rank_of(bytes(frames[0])))
            else:
                msg = decode(body, unpickle=False)
            out = self.alter(msg)
            if out is not None:
                for msg in out:
                    self._sock.send_multipart([frames[0], *to_wire(as_frames(msg))], *args, **kw)
                return None
        return self._sock.send_multipart(frames, *args, **kw)


class Rig:
    """A secure cluster of two nodes: the broker here (tapped), the workers as processes."""

    def __init__(self, root: Path, drivers: tuple[str, ...] = ("analyst",)) -> None:
        self.d = Deployment(root, drivers=drivers)
        curve = Curve(load_keypair(self.d.key("broker")), self.d.spec)
        self.broker = Broker(self.d.spec, "tcp://127.0.0.1:0", curve=curve)
        self.tap = Tap(self.broker.router)
        by_peer = self.broker.state.registry.by_peer
        self.tap.rank_of = lambda peer: by_peer[peer].rank
        self.broker.router = self.tap  # type: ignore[assignment]  # the tap in its place
        self.broker.start()
        self.d.address = self.broker.address
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.contexts: list[mp.Context] = []  # every driver connected: closed with the rig

    def start_worker(
        self, rank: int, cluster: Path | None = None, extra: Sequence[str] = ()
    ) -> None:
        proc = self.d.start_worker(
            rank, name=f"worker{rank}-{len(self.d.procs)}", cluster=cluster, extra=extra
        )
        self.workers[rank] = proc
        wait_until(lambda: self.serving(rank) == proc.pid, 30, f"worker {rank} to register")

    def serving(self, rank: int) -> int:
        """The pid of the worker the broker has at ``rank`` (0: none)."""
        entry = self.broker.state.registry.by_rank.get(rank)
        return entry.hello.pid if entry is not None else 0

    def stop_worker(self, rank: int) -> None:
        proc = self.workers.pop(rank)
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        wait_until(lambda: self.serving(rank) != proc.pid, 15, f"worker {rank} to be gone")

    def connect(self, driver: str = "analyst", **kw: Any) -> mp.Context:
        """A driver's context (``with`` only makes it current: the rig closes it)."""
        ctx = mp.connect(
            self.broker.address, key=self.d.key(driver), cluster=self.d.spec, timeout=30, **kw
        )
        self.contexts.append(ctx)
        return ctx

    def close(self) -> None:
        for ctx in self.contexts:  # its client's threads and sockets, while the broker runs
            with contextlib.suppress(Exception):
                ctx.close()
        self.d.close()  # every worker process, by pid
        self.broker.stop()
        self.broker.join(5)


def two_workers(root: Path, drivers: tuple[str, ...]) -> Iterator[Rig]:
    """A fixture's body: a :class:`Rig` listing ``drivers`` with workers 0 and 1 serving,
    closed (every process stopped by pid) when the test ends."""
    with contextlib.closing(Rig(root, drivers=drivers)) as made:
        made.start_worker(0)
        made.start_worker(1)
        yield made


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with contextlib.closing(Rig(tmp_path)) as made:
        yield made


def _runs_after_refusals(fn: Callable[[], Any], expected: Any) -> int:
    """Run ``fn`` on P0 until it returns ``expected``; how many times the worker refused it
    first (AuthenticationError: a stream it does not know)."""
    refused, message = 0, ""
    for _ in range(5):
        try:
            assert mp.fetch(fn()) == expected
            return refused
        except mp.AuthenticationError as exc:
            message = str(exc)
            refused += 1
        assert "does not know" in message, message
    raise AssertionError(f"refused {refused} times in a row")


def test_a_restarted_worker_refuses_a_recorded_early_exec_and_keeps_serving(
    rig: Rig, tmp_path: Path
) -> None:
    """The broker records the first job on P0 (code writing a file) and its program, then,
    once the worker restarted, hands both to the new process before an honest job: the file
    is written once. The driver's first job on the new process is refused (sealed for the
    old one); the refusal names the new incarnation, and the jobs after it run."""
    rig.start_worker(0)
    rig.start_worker(1)
    ran = tmp_path / "ran"
    path = str(ran)
    recorded: list[Record] = []

    def record(msg: Record) -> list[Record] | None:
        if isinstance(msg, Program | Exec) and len(recorded) < 2:
            recorded.append(msg)
        return None

    def replay(msg: Record) -> list[Record] | None:
        if isinstance(msg, Exec) and 0 in msg.bindings:
            rig.tap.alter = None
            return [*recorded, msg]  # the recorded program and Exec, then the honest one
        return None

    with rig.connect():
        rig.tap.alter = record
        first = mp.device("P0")(lambda: open(path, "a").write("ran\n"))  # noqa: SIM115
        assert mp.fetch(first()) == 4
        rig.tap.alter = None
        assert [type(m) for m in recorded] == [Program, Exec]
        replayed = recorded[1]
        assert isinstance(replayed, Exec)
        one = mp.device("P0")(lambda: 1)
        assert mp.fetch(one()) == 1

        rig.stop_worker(0)
        rig.start_worker(0)
        rig.tap.alter = replay
        refusals = _runs_after_refusals(one, 1)
        answers = wait_until(
            lambda: [m for m in rig.tap.received if getattr(m, "job", None) == replayed.job][1:],
            20,
            "the new worker's answer to the replayed Exec",
        )
        assert [type(m) for m in answers] == [Failed], answers
        assert answers[0].error.kind == "AuthenticationError"
        assert ran.read_text() == "ran\n"
        assert refusals <= 1
        assert all(mp.fetch(one()) == 1 for _ in range(3))
        assert mp.fetch(first()) == 4  # the code itself still runs when the driver asks
    assert ran.read_text() == "ran\nran\n"


def test_clients_before_and_after_a_restart_and_late_joiners_are_refused_once_at_most(
    rig: Rig,
) -> None:
    """Two clients of one driver, connected before worker 0 restarts, and two sessions
    opened while rank 0 has no worker at all (it joins later): each client has at most one
    job refused on the new process, then all its jobs run; a client that waits for the rank
    to be up in the broker's status (as scripts started with the cluster do) has none."""
    rig.start_worker(0)
    rig.start_worker(1)
    one = mp.device("P0")(lambda: 1)
    two = mp.device("P0")(lambda: 2)
    a, b = rig.connect(), rig.connect()
    late: list[mp.Context] = []
    try:
        with a:
            assert mp.fetch(one()) == 1
        with b:
            assert mp.fetch(two()) == 2
        rig.stop_worker(0)
        late += [rig.connect(), rig.connect()]  # rank 0 empty: no incarnation for it
        rig.start_worker(0)
        for ctx, fn, value in [(a, one, 1), (b, two, 2), (late[0], one, 1)]:
            with ctx:
                assert _runs_after_refusals(fn, value) <= 1
                assert all(mp.fetch(fn()) == value for _ in range(3))
        with late[1]:
            wait_until(
                lambda: all(r["state"] == "up" for r in late[1].status()["ranks"]),
                30,
                "every rank up in the status",
            )
            assert _runs_after_refusals(two, 2) == 0
    finally:
        for ctx in [a, b, *late]:
            ctx.close()


def test_a_session_opened_names_each_live_workers_public_incarnation() -> None:
    """What the broker tells a driver: the public incarnation of the worker at each rank
    (never the secret its hello carried), new once a new process serves the rank."""
    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    for rank in (0, 1):
        state.handle(f"w{rank}".encode(), WorkerHello(rank, f"s{rank}", 1, "h", "tcp://x:1", ""), 0)

    def opened() -> dict[int, str]:
        out = state.handle(b"drv:alice/1", OpenSession(1, "", 60.0, "c"), 0.0)
        msgs = [decode(encode(a.msg)) for a in out if isinstance(a.msg, SessionOpened)]
        assert len(msgs) == 1 and isinstance(msgs[0], SessionOpened)
        return dict(msgs[0].incarnations)

    assert opened() == {0: public_incarnation("s0"), 1: public_incarnation("s1")}
    assert "s0" not in opened().values()
    state.registry.remove(b"w0", "stopped", 1.0)
    assert opened() == {1: public_incarnation("s1")}
    state.handle(b"w0b", WorkerHello(0, "s0-again", 2, "h", "tcp://x:1", ""), 2.0)
    assert opened()[0] == public_incarnation("s0-again") != public_incarnation("s0")
