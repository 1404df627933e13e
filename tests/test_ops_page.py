"""The live views: `mpl-broker status --watch`, and the broker's HTML page on its metrics
port, checked in a real (headless) browser."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import Any

import pytest
from helpers import one

from mpl.broker.page import render_page
from mpl.broker.watch import CLEAR
from mpl.driver.launcher import daemon_command
from mpl.wire import GraphBuilder

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def one_job() -> Any:
    b = GraphBuilder(2)
    v = b.op("pcall", [], ranks=(0, 1), fn=b.fn(one))[0]
    return b.build([v])


@pytest.mark.daemons
def test_status_watch_redraws_and_stops_on_sigint(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    proc = subprocess.Popen(
        [*daemon_command("mpl-broker"), "status", cluster.address, "--watch", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out = bytearray()

    def read() -> None:
        assert isinstance(proc.stdout, io.BufferedReader)
        while chunk := proc.stdout.read1(4096):
            out.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        # a new process (imports, connect) and two frames 0.5 s apart: polled, with room for
        # a loaded machine, where the process alone may take seconds to start
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and out.count(CLEAR.encode()) < 2:
            time.sleep(0.05)
        assert out.count(CLEAR.encode()) >= 2, out.decode(errors="replace")
        assert b"rank" in out and b"up" in out
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - sent < 1.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        reader.join(5)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_page_is_self_contained_and_escapes_what_came_from_the_network() -> None:
    snap = {
        "status": {
            "broker_id": "b1",
            "world_size": 2,
            "ranks": [
                {"rank": 0, "state": "up", "host": "<img src=x>", "heartbeat_age_s": 0.2},
                {"rank": 1, "state": "lost", "reason": "its connection closed"},
            ],
            "sessions": [{"session": "s1", "name": "<b>n</b>", "drivers": 1, "jobs": 0}],
            "errors": ["bad message: <script>alert(1)</script>"],
        },
        "ledger": {
            "outcomes": {"ok": 1},
            "jobs_per_second": 0.1,
            "recent": [
                {
                    "job": "c.1",
                    "session": "s1",
                    "started": 100.0,
                    "seconds": 0.5,
                    "outcome": "ok",
                    "ranks": {"0": [100.0, 0.4], "1": [100.1, 0.3]},
                }
            ],
        },
    }
    html = render_page(snap, now=101.0)
    assert "<script" not in html and "<img" not in html and "<link" not in html
    assert "src=" not in html.replace("&lt;img src=x&gt;", "")
    assert "&lt;script&gt;" in html and "&lt;b&gt;n&lt;/b&gt;" in html
    assert html.count('class="job"') == 2 and 'data-job="c.1"' in html
    assert 'http-equiv="refresh"' in html


@pytest.mark.daemons
@pytest.mark.timeout(120)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_status_page_in_headless_chromium(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", broker_args=("--metrics-port", "0"))
    client = cluster.client()
    sid = client.open_session().session
    job = client.submit(sid, one_job(), {}, timeout=10).job
    url = cluster.impl.metrics_url("broker") + "/"
    with urllib.request.urlopen(url, timeout=10) as resp:  # the page the browser will get
        assert resp.headers["Content-Type"].startswith("text/html")
    profile = tempfile.mkdtemp(prefix="mpl-chromium-")
    try:
        done = subprocess.run(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "HOME": profile},
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    dom = done.stdout
    assert done.returncode == 0 and "<svg" in dom, done.stderr[-2000:]
    for rank in (0, 1):
        assert f'id="rank-{rank}" data-state="up"' in dom, dom[:3000]
    assert f'data-job="{job}" data-rank="0"' in dom and f'data-job="{job}" data-rank="1"' in dom
    assert f'<span id="last-job">{job}</span>' in dom
    assert '<b id="workers-up">2</b>' in dom
