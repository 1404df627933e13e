"""Review w29-b of this round's perf changes on hostile input (secure, fan, tail): two
low findings, both fixed by the lead; their tests pass.

* Finding 1 (tail): a worker's own version was looked up when the first session brought
  runtime_info, not as it started: a node whose package was upgraded under a running worker
  said it ran the new version, and served sessions asking for it with the old code. Fixed:
  the version is the code's own constant (``runtime_info.MPL_VERSION``).
* Finding 2 (fan): the broker made a Done reader for any peer whose frame starts as a Done,
  before it knew the peer was a worker: peers that are no worker evicted every worker's
  reader (a bounded table, first in first out), and the workers' Dones were read in full
  again. Fixed: a reader is kept only for a registered worker.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from pathlib import Path

import pytest
from test_broker_counts import STATS, _Shell
from test_done_repeat import counted_unpacks, full_done_reads

from mpl.wire.codec import encode, to_wire
from mpl.wire.jobs import Done
from mpl.worker.session_runtime import SessionRuntimes


def test_a_worker_claims_the_version_it_started_with_not_one_installed_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = version("mpl")
    runtimes = SessionRuntimes(0, dict)  # a worker starts: it runs `running`
    # then the node's mpl is upgraded (pip install -U) before any session reaches it
    newer = tmp_path / "mpl-99.0.dist-info"
    newer.mkdir()
    (newer / "METADATA").write_text("Metadata-Version: 2.1\nName: mpl\nVersion: 99.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert version("mpl") == "99.0"  # what the package metadata says now
    # a session asking for 99.0 is refused: this process runs `running`'s code
    why = runtimes.refusal({"version": "99.0", "platform": "N/A"})
    assert why is not None and running in why


def _done_reads(shell: _Shell, monkeypatch: pytest.MonkeyPatch, jobs: int) -> int:
    """msgpack reads of Done headers (read_done_header's) in ``jobs`` trivial jobs."""
    with counted_unpacks(monkeypatch) as reads:
        for _ in range(jobs):
            shell.job(lambda *_: None)
    return reads[0]


def test_peers_that_are_no_worker_do_not_evict_the_workers_done_readers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shell = _Shell(2)
    try:
        for _ in range(3):  # the workers' Dones kept: repeats read by comparison
            shell.job(lambda *_: None)
        assert _done_reads(shell, monkeypatch, 2) == 0
        # 256 connections that are no worker each send one Done (dropped: no worker)
        junk = Done(shell.sid, "j99999", 0, {0: 1}, STATS, {0: "int64[]"})
        frame = to_wire(encode(junk))
        size = sum(len(bytes(part)) for part in frame)
        routed = shell.broker.state.counters["bytes_routed"]
        for n in range(256):
            sock = shell._dealer(b"\x00junk%04d" % n)
            sock.send_multipart(frame)
        for _ in range(2000):  # turned until the broker has read every one of them
            if shell.broker.state.counters["bytes_routed"] - routed >= 256 * size:
                break
            shell.broker._turn(float("inf"))
        assert shell.broker.state.counters["bytes_routed"] - routed >= 256 * size
        # the workers' repeat Dones are read by comparison still: no msgpack read
        assert _done_reads(shell, monkeypatch, 4) == 0
    finally:
        shell.close()


def test_a_workers_repeat_dones_on_its_result_channel_are_read_by_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workers send their Dones on their result channels, not the socket they
    registered on: finding 2's fix must keep their readers all the same (the lead's first
    fix looked for the peer among the registered sockets only: every Done of a real worker
    then made a reader anew and was read in full, +100k instructions a job)."""
    import mpl.driver as mp

    ctx = mp.Simulator.simple(2)
    with ctx:
        both = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
        for _ in range(5):  # warm: each worker's first Done read in full and kept
            mp.fetch(both())
        reads = full_done_reads(monkeypatch)
        for _ in range(20):
            mp.fetch(both())
    ctx.close()
    assert reads[0] == 0, f"{reads[0]} of 40 repeat Dones read in full"
