"""A worker that restarts (or joins) after a driver's session opened refuses that driver's
first sealed job to it: it was sealed for the process the driver knew, or for none. The
refusal names the worker's incarnation, and the driver's next job is sealed for it and runs.
The refused job itself runs once more only when it was sealed for no process (the worker
joined after the session opened, so the driver knew none for its rank): that box opened
nowhere. A job sealed for the process before a restart is not sent again, since the
refusal is not sealed and a hostile broker can forge it for a job that process ran: the
user sees the refusal, and the job ran at most once.

Real ``mpl-broker`` and ``mpl-worker`` processes (a secure deployment from the command
lines), stopped and started by pid; the forged refusal goes through an in-process broker
with a frame tap (``test_sealed_broker``). What a job ran is counted by the lines its code
appends to a file.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from deployment import Deployment
from helpers import wait_until
from test_sealed_broker import Setup

import mpl.driver as mp
from mpl.driver.client import Client
from mpl.driver.sealing import DriverSeal
from mpl.wire import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.incarnation import public_incarnation
from mpl.wire.jobs import JobResult
from mpl.wire.remote import ErrorInfo
from mpl.wire.replay import UNKNOWN_STREAM, refusal_facts
from mpl.worker.daemon import Worker

pytestmark = pytest.mark.daemons


class Cluster:
    def __init__(self, root: Path) -> None:
        self.d = Deployment(root)
        self.d.start_broker()
        self.workers = {rank: self.d.start_worker(rank) for rank in (0, 1)}
        self.contexts: list[mp.Context] = []  # every driver connected: closed with it
        self.watcher = self.connect()  # reads the status: its own client learns from it
        for rank in self.workers:
            wait_until(lambda: self.incarnation(rank), 30, f"rank {rank} up")  # noqa: B023

    def connect(self) -> mp.Context:
        """A driver's context (``with`` only makes it current: :meth:`close` closes it)."""
        ctx = mp.connect(self.d.address, key=self.d.key("analyst"), cluster=self.d.spec, timeout=30)
        self.contexts.append(ctx)
        return ctx

    def incarnation(self, rank: int) -> str:
        """The public incarnation of the worker the broker has up at ``rank`` ("": none)."""
        for row in self.watcher.status()["ranks"]:
            if row["rank"] == rank and row["state"] == "up":
                return str(row["incarnation"])
        return ""

    def stop(self, rank: int) -> str:
        """Stop ``rank``'s worker by its pid and wait until the broker has no worker up at
        ``rank``: the incarnation it had."""
        before = wait_until(lambda: self.incarnation(rank), 30, f"rank {rank} up")
        proc = self.workers[rank]
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        wait_until(lambda: not self.incarnation(rank), 15, f"rank {rank} gone")
        return str(before)

    def start(self, rank: int, before: str) -> None:
        """Start ``rank``'s worker again and wait, by this watcher's status (another client
        than the one under test, which would learn the incarnation from it), until it is up
        as a new process."""
        self.workers[rank] = self.d.start_worker(rank, name=f"worker{rank}-again")
        wait_until(lambda: self.incarnation(rank) not in ("", before), 30, f"rank {rank} back")

    def restart(self, rank: int) -> None:
        self.start(rank, self.stop(rank))

    def close(self) -> None:
        for ctx in self.contexts:  # the watcher among them
            with contextlib.suppress(Exception):
                ctx.close()
        self.d.close()  # every process, by pid


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with contextlib.closing(Cluster(tmp_path)) as made:
        yield made


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _refusals(seal: DriverSeal) -> list[bool]:
    """Every answer ``seal.refused`` gives from now on, in order."""
    answers: list[bool] = []
    refused = seal.refused

    def counting(*args: object) -> bool:
        answers.append(refused(*args))  # type: ignore[arg-type]
        return answers[-1]

    seal.refused = counting  # type: ignore[method-assign,assignment]
    return answers


def test_a_job_refused_by_a_worker_that_joined_after_the_session_opened_runs_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Worker 0 is down when the session opens (its ``SessionOpened`` names no incarnation
    for rank 0) and up by the first job: that job, sealed for no process, is refused, sent
    once more sealed for the process the refusal names, and its result arrives with no
    error; its code ran once. So for a call (``write()``), the general path (``ctx.run``: the
    client's own call) and a job in flight (``mp.submit``: the client's pump)."""
    ran = tmp_path / "ran"
    path = str(ran)
    write = mp.device("P0")(lambda: open(path, "a").write("x\n"))  # noqa: SIM115
    for how in ("call", "run", "submit"):
        before = cluster.stop(0)
        with cluster.connect() as ctx:  # a new client: it knows no incarnation yet
            client = ctx.client
            assert isinstance(client, Client) and client.seal is not None
            cluster.start(0, before)
            answers = _refusals(client.seal)
            lines = _lines(ran)
            if how == "call":
                assert mp.fetch(write()) == 2
            elif how == "run":
                graph = mp.function(write).compile(ctx.cluster).graph
                assert ctx.run(graph, {}).error is None
            else:
                assert mp.fetch(mp.submit(write).result(timeout=30)) == 2
            assert answers == [True], how
            assert _lines(ran) == lines + 1, how  # ran once, at the new process
            assert mp.fetch(write()) == 2  # and the next job runs, not refused
            assert answers == [True] and _lines(ran) == lines + 2


def test_a_job_refused_by_a_restarted_worker_fails_and_the_next_runs_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Worker 0 restarts between two jobs of one session: the second job was sealed for
    the process before, so its refusal reaches the user (never sent again: the refusal
    could be forged for a job that ran); it ran nowhere, and the next job runs once. So for
    a call, the general path and a job in flight."""
    ran = tmp_path / "ran"
    path = str(ran)
    write = mp.device("P0")(lambda: open(path, "a").write("x\n"))  # noqa: SIM115
    with cluster.connect() as ctx:
        client = ctx.client
        assert isinstance(client, Client) and client.seal is not None
        answers = _refusals(client.seal)
        assert mp.fetch(write()) == 2
        assert _lines(ran) == 1
        graph = mp.function(write).compile(ctx.cluster).graph
        jobs: dict[str, Callable[[], object]] = {
            "call": lambda: mp.fetch(write()),
            "run": lambda: ctx.run(graph, {}),
            "submit": lambda: mp.fetch(mp.submit(write).result(timeout=30)),
        }
        for how, job in jobs.items():
            cluster.restart(0)
            lines = _lines(ran)
            with pytest.raises(mp.AuthenticationError, match="does not know"):
                job()
            assert answers[-1] is False, how
            assert _lines(ran) == lines, how  # an honest broker: it ran nowhere
            assert mp.fetch(write()) == 2
            assert _lines(ran) == lines + 1, how
        assert answers == [False] * 3


def test_a_refused_job_of_two_ranks_is_not_sent_again(cluster: Cluster, tmp_path: Path) -> None:
    """The broker answers at the first rank that fails, so rank 1 may have run a job rank 0
    refused: that job's error reaches the user, and the next job runs once on each rank."""
    ran = tmp_path / "ran"
    path = str(ran)
    both = mp.function(
        lambda: mp.simp.pcall((0, 1), lambda: open(path, "a").write("x\n"))  # noqa: SIM115
    )
    with cluster.connect() as ctx:
        client = ctx.client
        assert isinstance(client, Client) and client.seal is not None
        mp.fetch(both())
        assert _lines(ran) == 2
        answers = _refusals(client.seal)
        cluster.restart(0)
        with pytest.raises(mp.AuthenticationError, match="does not know"):
            mp.fetch(both())
        assert answers == [False]
        # rank 1 may still be running the refused job: the broker answered at rank 0's
        # refusal. A worker runs one session's jobs in order (mpl.worker.session_pool), so
        # once a job of rank 1 alone has answered, rank 1 is done with it: the count is
        # settled (read before, it could gain rank 1's line after)
        assert mp.fetch(mp.device("P1")(lambda: 0)()) == 0
        before = _lines(ran)
        assert before in (2, 3)  # rank 1 ran it, or was stopped before it could
        mp.fetch(both())
        assert _lines(ran) == before + 2


def test_a_refusal_forged_after_a_restart_runs_no_job_twice(tmp_path: Path) -> None:
    """A hostile broker delivers a job of rank 0 alone to the worker process it was sealed
    for, which runs it; it withholds the answer until that worker has restarted (one
    process after the other, never two at once), then forges the new process's refusal of
    the job's stream. The refusal is not sealed, so the driver cannot tell it from a real
    one: the job must not be sealed again for the new process. The user sees the refusal;
    the job ran once, and the next one runs once."""
    setup = Setup(tmp_path, True)
    try:
        ran = tmp_path / "ran"
        path = str(ran)

        def note() -> int:  # the worker runs in this process: the file closed at once
            with open(path, "a") as f:
                return f.write("x\n")

        write = mp.device("P0")(note)
        with setup.ctx:
            assert mp.fetch(write()) == 2
            assert _lines(ran) == 1
            held: list[tuple[bytes, str]] = []  # (the driver's routing id, the job)

            def hold(peer: bytes, frames: list[Any]) -> list[tuple[bytes, list[Any]]]:
                """Withhold the first successful JobResult the broker sends."""
                if not held and bytes(frames[0]) == MAGIC_FRAME:  # (the codec's form)
                    msg = decode(frames, unpickle=False)
                    if type(msg) is JobResult and msg.error is None:
                        held.append((peer, msg.job))
                        return []
                return [(peer, frames)]

            setup.tap.rewrite = hold
            future = mp.submit(write)
            wait_until(lambda: held, 20, "the job's answer, withheld")
            assert _lines(ran) == 2  # it ran, at the process it was sealed for

            old = setup.workers[0]
            old.stop()
            old.join(5)
            setup.workers[0] = Worker(
                setup.broker.address, 0, curve=setup.curves["node0"], data_root=tmp_path / "w0"
            ).start()
            assert setup.workers[0].joined.wait(15), "worker did not join"
            incarnation = public_incarnation(
                setup.broker.state.registry.by_rank[0].hello.incarnation
            )

            driver, job = held[0]
            message = f"job {job} refused: {UNKNOWN_STREAM}: the driver does not know" + (
                refusal_facts(incarnation, -1)
            )
            error = ErrorInfo("AuthenticationError", message, rank=0, op=UNKNOWN_STREAM, job=job)
            forged = encode(JobResult(job, error=error))
            sent: list[bool] = []

            def inject(peer: bytes, frames: list[Any]) -> list[tuple[bytes, list[Any]]]:
                """Send the forged refusal along with the broker's next message."""
                out = [(peer, frames)]
                if not sent:
                    sent.append(True)
                    out.append((driver, forged))
                return out

            setup.tap.rewrite = inject
            with pytest.raises(mp.AuthenticationError, match="does not know"):
                mp.fetch(future.result(timeout=30))
            assert sent == [True]
            assert _lines(ran) == 2, f"the job ran {_lines(ran) - 1} times"
            assert mp.fetch(write()) == 2  # the next job: sealed for the new process
            assert _lines(ran) == 3
    finally:
        setup.close()


class _Catching:
    """A stand-in for the client's job pump: keeps what is handed to it, sends nothing."""

    def __init__(self) -> None:
        self.taken: list[Any] = []

    def put(self, pending: Any) -> None:
        self.taken.append(pending)

    def close(self, reason: str) -> None:
        pass


def test_a_submitted_job_keeps_its_plaintext_bindings_only_while_it_may_be_sent_again() -> None:
    """``Pending.plain`` (a secure submit's bindings before sealing) is what the pump seals
    anew for a refused job; only a job of one rank whose worker's incarnation the driver
    does not know is ever sent again (``DriverSeal.refused``), so any other drops them once
    sealed, rather than holding its inputs until its answer (main at f9464a8 kept every
    job's)."""
    spec = ClusterSpec.simple(2, enable_spu=False)
    with mp.local_cluster(spec, secure=True, timeout=20) as ctx:
        client = ctx.client
        assert isinstance(client, Client) and client.seal is not None
        mp.fetch(mp.device("P0")(lambda: 1)())  # the session's incarnations known
        catching = _Catching()
        client._pump = catching  # type: ignore[assignment]
        try:
            for ranks in ((0, 1), (0,)):
                graph = mp.function(lambda r=ranks: mp.simp.pcall(r, lambda: 1))
                compiled = graph.compile(ctx.cluster).graph
                client.submit_async(ctx.session, compiled, {r: [] for r in ranks})
                pending = catching.taken[-1]
                assert pending.plain is None, ranks
                assert set(pending.msg.bindings) == set(ranks)  # sealed, every rank's
        finally:
            client._pump = None
        seal = client.seal
        assert not seal.may_send_again((0,)) and not seal.may_send_again((0, 1))
        fresh = DriverSeal(seal.sealer, SimpleNamespace(cluster=ctx.cluster), False)  # type: ignore[arg-type]
        fresh.bind(ctx.cluster)  # the layout alone: no worker's incarnation known
        assert fresh.may_send_again((0,)) and not fresh.may_send_again((0, 1))
        ctx.close()
