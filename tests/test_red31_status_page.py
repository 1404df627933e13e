"""Red team w31, finding R3: a secure broker's ``/status.json`` named every recent job's
session to anyone who could reach the metrics port.

The README promises that a secure broker's status page and ``/status.json`` (whose HTTP
clients nobody authenticates) show every session only as a count. ``anonymous`` emptied
the status's session rows, but the same JSON carries the job ledger, whose last 200 jobs
each named their session id (the name its driver chose, say ``payroll-2026``, and its
owner tag) and job id. Now a secure broker's page and JSON keep the ledger's counts and
timings and drop which session and job each recent one was.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import mpl.driver as mp


@pytest.mark.daemons
@pytest.mark.timeout(180)
def test_a_secure_brokers_status_json_names_no_session_of_a_job(tmp_path: Path) -> None:
    with (
        mp.local_cluster(
            2, secure=True, run_dir=tmp_path, broker_args=("--metrics-port", "0")
        ) as ctx,
        ctx,
    ):
        session = ctx.session
        x = mp.put("P0", np.arange(3.0))
        assert list(mp.fetch(mp.device("P0")(np.negative)(x))) == [-0.0, -1.0, -2.0]
        base = ctx.processes.metrics_url("broker")
        with urllib.request.urlopen(base + "/status.json", timeout=10) as reply:
            text = reply.read().decode()
        with urllib.request.urlopen(base, timeout=10) as reply:
            page = reply.read().decode()
    shown = json.loads(text)
    assert shown["status"]["sessions"] == []
    assert shown["ledger"]["recent"], "the ledger shows the jobs (counts and timings)"
    assert session.split("~")[0] not in text, f"/status.json names session {session}"
    assert session.split("~")[0] not in page
    recent = shown["ledger"]["recent"]
    assert all("session" not in job and "job" not in job for job in recent), recent[0]
