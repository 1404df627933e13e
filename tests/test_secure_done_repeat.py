"""A secure worker's repeat Done read by comparison at the broker (``mpl.wire.done_repeat``).

In secure mode a trivial job's Done carries its value as a compact box, sealed anew for
every job: the bytes outside the job id, that box and the stats blob repeat, so the broker
reads the Done by comparison, taking the box as it comes, as it takes the stats. The broker,
its workers and a driver run here on loopback TCP, each with its own key, through the
broker's own loop (its compiled socket, no stand-in): ``test_worker_calls.secure_threads``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_done_repeat import full_done_reads
from test_worker_calls import secure_threads

import mpl.driver as mp
from mpl.wire import ClusterSpec


def test_a_secure_workers_repeat_dones_are_read_by_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every secure Done read in full (40 of 40 here); the answers are the same."""
    reads = [0]
    with secure_threads(tmp_path, ClusterSpec.simple(2), data_roots=True) as (broker, _, _):
        try:
            both = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
            # warm: each worker's first Done (the session's set-up job's) kept, missed by
            # the next 8 and dropped, then read in full for a back-off of 16 Dones, and
            # the next one kept
            for _ in range(30):
                assert mp.fetch(both()) == [1, 1]
            reads = full_done_reads(monkeypatch)
            for _ in range(20):
                assert mp.fetch(both()) == [1, 1]
        finally:
            monkeypatch.undo()  # the real Done reader back before the daemons stop
    assert reads[0] == 0, f"{reads[0]} of 40 secure repeat Dones read in full"
    assert sum(r.repeats for r in broker._done_readers.values()) >= 40
