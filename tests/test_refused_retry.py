"""A worker that restarts (or joins) after a driver's session opened refuses that driver's
first sealed job to it: it was sealed for the process the driver knew. The driver then runs
the job once more, sealed for the process the refusal names, when it ran nowhere: the job
had that rank alone. The user sees its result, never the refusal, and the job ran once.

Real ``mpl-broker`` and ``mpl-worker`` processes (a secure deployment from the command
lines), stopped and started by pid. What a job ran is counted by the lines its code
appends to a file.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from deployment import Deployment
from helpers import wait_until

import mpl.driver as mp
from mpl.driver.client import Client
from mpl.driver.sealing import DriverSeal

pytestmark = pytest.mark.daemons


class Cluster:
    def __init__(self, root: Path) -> None:
        self.d = Deployment(root)
        self.d.start_broker()
        self.workers = {rank: self.d.start_worker(rank) for rank in (0, 1)}
        self.watcher = self.connect()  # reads the status: its own client learns from it
        for rank in self.workers:
            wait_until(lambda: self.incarnation(rank), 30, f"rank {rank} up")  # noqa: B023

    def connect(self) -> mp.Context:
        return mp.connect(
            self.d.address, key=self.d.key("analyst"), cluster=self.d.spec, timeout=30
        )

    def incarnation(self, rank: int) -> str:
        """The public incarnation of the worker the broker has up at ``rank`` ("": none)."""
        for row in self.watcher.status()["ranks"]:
            if row["rank"] == rank and row["state"] == "up":
                return str(row["incarnation"])
        return ""

    def restart(self, rank: int) -> None:
        before = wait_until(lambda: self.incarnation(rank), 30, f"rank {rank} up")
        proc = self.workers[rank]
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        wait_until(lambda: self.incarnation(rank) != before, 15, f"rank {rank} gone")
        self.workers[rank] = self.d.start_worker(rank, name=f"worker{rank}-again")
        wait_until(lambda: self.incarnation(rank) not in ("", before), 30, f"rank {rank} back")

    def close(self) -> None:
        self.watcher.close()
        self.d.close()  # every process, by pid


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.close()


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


def test_a_job_refused_by_a_restarted_worker_runs_once_more_and_once_only(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Worker 0 restarts between two jobs of one session: the second job's result arrives,
    with no error, after one refusal, and its code ran once (on rank 0, its only rank).
    So through the general path (``ctx.run``: the client's own call) and for a job in flight
    (``mp.submit``) too."""
    ran = tmp_path / "ran"
    path = str(ran)
    write = mp.device("P0")(lambda: open(path, "a").write("x\n"))  # noqa: SIM115
    with cluster.connect() as ctx:
        client = ctx.client
        assert isinstance(client, Client) and client.seal is not None
        answers = _refusals(client.seal)
        assert mp.fetch(write()) == 2
        assert _lines(ran) == 1

        cluster.restart(0)
        assert mp.fetch(write()) == 2  # no error: the refused job ran again
        assert answers == [True]
        assert _lines(ran) == 2  # once for the first job, once for the second
        assert mp.fetch(write()) == 2
        assert answers == [True] and _lines(ran) == 3

        graph = mp.function(write).compile(ctx.cluster).graph
        cluster.restart(0)
        assert ctx.run(graph, {}).error is None
        assert answers == [True, True] and _lines(ran) == 4

        cluster.restart(0)  # a job in flight (mp.submit): the client's pump sends it again
        assert mp.fetch(mp.submit(write).result(timeout=30)) == 2
        assert answers == [True, True, True] and _lines(ran) == 5


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
        before = _lines(ran)
        assert before in (2, 3)  # rank 1 ran it, or was stopped before it could
        mp.fetch(both())
        assert _lines(ran) == before + 2
