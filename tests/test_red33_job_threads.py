"""Red team w33 (R33-5, fixed): a party and a driver held all of a peer's job threads.

A worker runs pooled jobs on 64 threads (``MAX_JOB_THREADS``), one task per session at a
time. A job waiting for a peer's move holds its thread until the move comes, the job is
aborted, or its deadline (the broker's ``--job-timeout``, 600 s by default). So a hostile
party with a driver of its own (each party may well have one listed) made a peer's worker
wait for moves it never sends: 64 sessions, one job each that shuffles a value from the
hostile rank to the victim, held every job thread of the victim for the deadline, and any
other driver's job that needed a thread there (the first run of a program, anything not
inline) waited with them, though the hostile party had no part in it. Here the hostile
party is a raw socket registered as rank 1 that heartbeats and never sends a move, and the
other driver's one-rank job on P0 did not finish within 20 s.

The fix (``mpl.worker.session_pool``): the pool is shared out by owner, as the holding area
is by sender; no owner's jobs hold more than ``owner_share`` threads (48 of 64) and a job
past its owner's share waits parked, not on a thread. A secure worker keys the share by
the driver that sealed the job; a plaintext one, which no driver identity reaches, by the
job's ranks (this test is plaintext: the hostile jobs are ranks (0, 1), the other
driver's (0,)). A hostile party with several listed drivers, or a plaintext driver
varying its jobs' ranks, gets several shares: a limitation ``docs/trust.md`` states.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from helpers import one, stats, wait_until
from test_authz_daemons import Raw

import mpl.driver as mp
from mpl.wire import GraphBuilder
from mpl.wire.control import Heartbeat, Welcome, WorkerHello
from mpl.wire.jobs import Exec, Program
from mpl.wire.limits import MAX_JOB_THREADS
from mpl.worker.session_pool import owner_share

pytestmark = pytest.mark.daemons


class _SilentParty:
    """A raw socket registered as ``rank`` in place of its worker: it heartbeats, so the
    broker keeps it, and sends nothing else (no move, no answer)."""

    def __init__(self, cluster: Any, rank: int) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._raw = Raw(self._ctx, cluster.address)  # connected before the worker goes
        cluster.impl.kill_worker(rank, signal.SIGTERM)
        wait_until(lambda: stats(cluster.clients[0], rank)["state"] != "up", what="rank to go")
        self._raw.send(WorkerHello(rank, "silent", 1, "hostile", "tcp://127.0.0.1:9", ""))
        self._raw.wait_for(lambda m: isinstance(m, Welcome))
        self._rank = rank
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(0.3):
            self._raw.send(Heartbeat(rank=self._rank))
            while self._raw.sock.poll(0):
                self._raw.sock.recv_multipart()  # Execs, directories: ignored

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._raw.sock.close()
        self._ctx.term()


@pytest.fixture
def silent_rank_1(make_cluster: Callable[..., Any]) -> Iterator[tuple[Any, _SilentParty]]:
    cluster = make_cluster("tcp", world_size=2)
    cluster.client()  # the watcher the status reads use
    party = _SilentParty(cluster, 1)
    try:
        yield cluster, party
    finally:
        party.close()


def test_a_silent_party_and_its_driver_cannot_starve_another_drivers_jobs(
    silent_rank_1: tuple[Any, _SilentParty],
) -> None:
    cluster, _party = silent_rank_1
    share = owner_share(MAX_JOB_THREADS)
    hostile = Raw(zmq.Context.instance(), cluster.address)  # the hostile party's driver
    try:
        b = GraphBuilder(2)
        x = b.op("constant", [], ranks=(1,), value=1)[0]
        moved = b.op("shuffle", [x], ranks=(0, 1), routing={0: 1})[0]
        waits = b.build([moved])
        hostile.send(Program(waits.digest, waits))
        for n in range(MAX_JOB_THREADS):  # one session each: the pool runs a session's
            sid = hostile.open_session(f"hold{n}")  # tasks one at a time
            hostile.send(Exec(sid, f"hold-{n}", waits.digest, (0, 1), {}, (), 300.0))
        # as many of rank 0's job threads as one owner may hold (before the fix: all 64)
        wait_until(
            lambda: stats(cluster.clients[0], 0).get("jobs_running", 0) >= share,
            60,
            "the hostile jobs to take their share of rank 0's job threads",
        )
        # another driver's job on P0 alone, its program's first run (so not inline)
        with mp.connect(cluster.address) as ctx:
            try:
                v = GraphBuilder(2)
                mine = v.op("pcall", [], ranks=(0,), fn=v.fn(one), args=())[0]
                result = ctx.run(v.build([mine]), {}, inline=(0,), timeout=20.0)
                assert result.error is None
            finally:
                ctx.close()
        # for the right reason: the hostile jobs hold their share and no more, the rest
        # of them parked until one of theirs ends
        assert stats(cluster.clients[0], 0)["jobs_running"] == share
    finally:
        hostile.sock.close()
