"""A secure worker's repeat Done read by comparison at the broker (``mpl.wire.done_repeat``).

In secure mode a trivial job's Done carries its value as a compact box, sealed anew for
every job: the bytes outside the job id, that box and the stats blob repeat, so the broker
reads the Done by comparison, taking the box as it comes, as it takes the stats. The broker,
its workers and a driver run here on loopback TCP, each with its own key, through the
broker's own loop (its compiled socket, no stand-in).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_done_repeat import full_done_reads

import mpl.driver as mp
from mpl.broker.daemon import Broker
from mpl.wire import ClusterSpec
from mpl.wire.curve import Curve
from mpl.wire.keys import load_keypair, write_keypair
from mpl.worker.daemon import Worker


def test_a_secure_workers_repeat_dones_are_read_by_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every secure Done read in full (40 of 40 here); the answers are the same."""
    names = ("broker", "node0", "node1", "analyst")
    made = {n: write_keypair(tmp_path / "keys", n) for n in names}
    spec = ClusterSpec.simple(2).with_keys(
        made["broker"][2], [made["node0"][2], made["node1"][2]], {"analyst": made["analyst"][2]}
    )
    curves = {n: Curve(load_keypair(made[n][1]), spec) for n in names[:3]}
    broker = Broker(spec, "tcp://127.0.0.1:0", curve=curves["broker"]).start()
    workers: list[Worker] = []
    reads = [0]
    try:
        for rank in range(2):
            worker = Worker(
                broker.address, rank, curve=curves[f"node{rank}"], data_root=tmp_path / f"d{rank}"
            )
            workers.append(worker.start())
        for worker in workers:
            assert worker.joined.wait(15), "worker did not join"
        ctx = mp.connect(broker.address, key=made["analyst"][1], cluster=spec, timeout=20)
        with ctx:
            both = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
            # warm: each worker's first Done (the session's set-up job's) kept, missed by
            # the next 8 and dropped, then read in full for a back-off of 16 Dones, and
            # the next one kept
            for _ in range(30):
                assert mp.fetch(both()) == [1, 1]
            reads = full_done_reads(monkeypatch)
            for _ in range(20):
                assert mp.fetch(both()) == [1, 1]
        ctx.close()
    finally:
        monkeypatch.undo()  # the real Done reader back before the daemons stop
        for worker in workers:
            worker.stop()
        for worker in workers:
            worker.join(5)
        broker.stop()
        broker.join(5)
    assert reads[0] == 0, f"{reads[0]} of 40 secure repeat Dones read in full"
    assert sum(r.repeats for r in broker._done_readers.values()) >= 40
