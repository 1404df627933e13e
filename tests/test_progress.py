"""Progress of long jobs: workers report, the broker checks and forwards, the driver draws a
bar on a terminal only, and ctx.status() shows the same numbers."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import nap, wait_until
from test_broker_state import W0, W1, D, open_session, program

from mpl.broker.state import BrokerState
from mpl.driver.job_progress import JobProgress, ProgressBoard, progress
from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.jobs import Done, Exec
from mpl.wire.progress import Progress
from mpl.wire.record import Record

ROOT = Path(__file__).resolve().parent.parent

# Eight ops of 0.25 s on P0: a job of about 2 s. A thread polls ctx.status() meanwhile.
SCRIPT = """
import json, threading, time
import mpl.driver as mp

def nap(x):
    time.sleep(0.25)
    return x + 1

@mp.function
def slow(x):
    for _ in range(8):
        x = mp.device("P0")(nap)(x)
    return x

seen = []
with mp.Simulator.simple(2, enable_spu=False) as sim:
    start = mp.put("P0", 0)
    stop = threading.Event()
    def poll():
        while not stop.is_set():
            seen.extend(p for p in sim.status()["progress"].values() if p["rank"] is not None)
            time.sleep(0.1)
    t = threading.Thread(target=poll)
    t.start()
    out = mp.fetch(slow(start))
    stop.set()
    t.join()
print(json.dumps({"out": out, "seen": seen}))
"""


def run_script(
    tmp_path: Path, *, tty: bool, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], str]:
    """Run SCRIPT with stderr on a pseudo-terminal (or a pipe); return its result and stderr."""
    script = tmp_path / "slow_job.py"
    script.write_text(SCRIPT)
    full_env = {**os.environ, "JAX_ENABLE_X64": "1", **(env or {})}
    full_env.pop("MPL_PROGRESS", None) if env is None else None
    if not tty:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=full_env, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=slave, env=full_env
    )
    os.close(slave)
    err = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not chunk:
                    break
                err += chunk
            elif proc.poll() is not None:
                break
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master)
    assert proc.returncode == 0, err.decode(errors="replace")
    return json.loads(out), err.decode(errors="replace")


@pytest.mark.timeout(120)
def test_bar_on_a_terminal_reaches_100_percent_and_status_shows_progress(tmp_path: Path) -> None:
    result, err = run_script(tmp_path, tty=True)
    assert result["out"] == 8
    assert "mpl job" in err and "100%" in err and "8/8" in err, err
    # ctx.status() saw the job part-way, with the op running and the rank's totals
    seen = result["seen"]
    assert seen, "ctx.status() never showed the running job"
    assert all(p["total"] == 8 and p["rank"] == 0 and "nap" in p["op"] for p in seen)
    assert any(0 < p["done"] < 8 for p in seen)


@pytest.mark.timeout(120)
def test_no_bar_without_a_terminal_or_when_turned_off(tmp_path: Path) -> None:
    result, err = run_script(tmp_path, tty=False)
    assert result["out"] == 8 and err == ""
    result, err = run_script(tmp_path, tty=True, env={"MPL_PROGRESS": "0"})
    assert result["out"] == 8 and "mpl job" not in err
    assert result["seen"], "the numbers are kept when the bar is off"


def test_progress_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPL_PROGRESS", "0")
    try:
        assert progress() is False
        assert progress(True) is True and progress() is True
        assert progress(False) is False
    finally:
        import mpl.driver.job_progress as module

        module._enabled = None


def test_board_reports_the_slowest_rank_and_forgets_ended_jobs() -> None:
    board = ProgressBoard()
    board.begin("j")
    seen: list[JobProgress] = []
    board.watch("j", seen.append)
    board.update(Progress("s", "j", 0, 5, 8, "3 (pcall a)"))
    board.update(Progress("s", "j", 1, 2, 4, "1 (pcall b)"))
    board.update(Progress("s", "other", 1, 1, 1, "x"))  # not a job of ours
    assert (got := board.get("j")) is not None and got.slowest() == (1, 2, 4, "1 (pcall b)")
    assert set(board.running()) == {"j"} and len(seen) == 2
    board.end("j", ok=True)
    assert board.running() == {} and board.get("j") is None


def test_broker_forwards_progress_only_from_the_rank_itself_throttled() -> None:
    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    from test_broker_state import hello

    state.handle(W0, hello(0), 0.0)
    state.handle(W1, hello(1), 0.0)
    sid = open_session(state)
    p = program()
    state.handle(D, p, 0.0)
    state.handle(D, Exec(sid, "j", p.digest, (0, 1), {}), 0.1)

    def forwarded(peer: bytes, msg: Progress, now: float) -> list[Record]:
        return [a.msg for a in state.handle(peer, msg, now) if a.peer == D]

    assert forwarded(W0, Progress(sid, "j", 0, 1, 4, "op"), 1.0) == [
        Progress(sid, "j", 0, 1, 4, "op")
    ]
    assert forwarded(W0, Progress(sid, "j", 0, 2, 4, "op"), 1.05) == []  # too soon after
    assert forwarded(W0, Progress(sid, "j", 1, 2, 4, "op"), 1.5) == []  # rank 0 speaks for 1
    assert forwarded(W0, Progress(sid, "ghost", 0, 2, 4, "op"), 1.5) == []  # no such job
    assert forwarded(W0, Progress("other", "j", 0, 2, 4, "op"), 1.5) == []  # wrong session
    assert len(forwarded(W1, Progress(sid, "j", 1, 2, 4, "op"), 1.5)) == 1
    state.handle(W0, Done(sid, "j", 0), 1.6)
    assert forwarded(W0, Progress(sid, "j", 0, 4, 4, "op"), 2.0) == []  # rank 0 has finished


def test_a_long_single_op_is_reported_while_it_runs(make_cluster: Any) -> None:
    cluster = make_cluster("inproc")
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    v = b.op("pcall", [], ranks=(0,), fn=b.fn(nap), args=(1.5,))[0]
    graph = b.build([v])
    ended = threading.Event()

    def run() -> None:
        client.submit(sid, graph, {}, timeout=20)
        ended.set()

    t = threading.Thread(target=run)
    t.start()
    try:
        seen = wait_until(
            lambda: [p for p in client.progress.running().values() if p["rank"] == 0],
            timeout=5,
            what="a report of the op in progress",
        )
        assert not ended.is_set()
        assert seen[0]["done"] == 0 and seen[0]["total"] == 1 and "nap" in seen[0]["op"]
    finally:
        t.join(20)
    assert ended.is_set() and client.progress.running() == {}


def test_jobs_that_never_report_build_no_progress_record_and_stay_bounded() -> None:
    import mpl.driver.job_progress as job_progress

    board = ProgressBoard()
    for i in range(job_progress._REMEMBERED + 10):
        board.begin(f"j{i}")
    # short jobs (no report, nobody asking) cost a start time each, no JobProgress
    assert board._jobs == {}
    running = board.running()  # asking builds them: every job still in flight, newest kept
    assert len(running) == job_progress._REMEMBERED and "j0" not in running
    assert running[f"j{job_progress._REMEMBERED + 9}"]["done"] == 0
    board.end(f"j{job_progress._REMEMBERED + 9}", ok=True)
    assert board.get(f"j{job_progress._REMEMBERED + 9}") is None
    assert len(board.running()) == job_progress._REMEMBERED - 1
