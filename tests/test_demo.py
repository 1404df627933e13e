"""The README's run command works: scripts/demo.sh --short against real daemons."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.daemons
@pytest.mark.timeout(300)
def test_demo_short_runs_the_examples() -> None:
    env = {**os.environ, "MPL_VENV": os.environ.get("MPL_VENV", str(ROOT / ".venv"))}
    out = subprocess.run(
        [str(ROOT / "scripts" / "demo.sh"), "--short"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "joint statistics computed at P2" in out.stdout
    assert "report at P0 and P2" in out.stdout
    assert not list((ROOT / ".mpl" / "demo-run").glob("*.pid"))  # the cluster was stopped
    # the whole status table (every rank), then where the last job's trace is
    table = out.stdout.split("== the cluster now", 1)[1]
    assert all(f"\n{rank}     up" in table for rank in range(3)), table
    assert "recent errors" in table
    trace = ROOT / ".mpl" / "demo-run" / "last-job.trace.json"
    assert f"trace of the last job (examples/pipeline.py): {trace}" in out.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e.get("ph") == "X"} >= {0, 1, 2}  # a row per rank
