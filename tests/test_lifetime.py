"""Daemons die with the process that started them, not with the thread that did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

pytestmark = pytest.mark.daemons


def test_a_worker_restarted_from_a_short_lived_thread_keeps_running(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    cluster.impl.kill_worker(0)
    wait_until(lambda: client.status()["ranks"][0]["state"] != "up", what="rank 0 seen lost")

    def restart() -> None:  # the thread lives until the worker is up, then ends
        cluster.impl.start_worker(0)
        cluster.impl.wait_ready(20)

    starter = threading.Thread(target=restart)
    starter.start()
    starter.join()
    proc = cluster.impl.workers[0]
    # before, the worker got SIGTERM as the thread that started it ended: watch a while
    watch_until = time.monotonic() + 2.0
    while time.monotonic() < watch_until:
        assert proc.poll() is None, "the worker stopped when its starting thread ended"
        assert client.status()["ranks"][0]["state"] == "up"
        time.sleep(0.1)  # polling for a failure within a bounded window


def test_daemons_stop_when_their_parent_process_dies(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from mpl.driver.launcher import ProcessCluster
                from mpl.wire import ClusterSpec
                c = ProcessCluster(ClusterSpec.simple(2, enable_spu=False),
                                   run_dir=Path({str(tmp_path)!r}))
                print(*c.pids(), flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
    wait_until(lambda: not any(_alive(p) for p in pids), timeout=10, what="the daemons to stop")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (reaped by nobody yet) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
