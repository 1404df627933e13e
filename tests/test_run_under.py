"""``run_under``: a local cluster's daemons run under a command (a profiler, as in
scripts/profile_jobs.py), which is then each daemon's process (its pid the one stopped)."""

from __future__ import annotations

import sys
from pathlib import Path

import mpl.driver as mp

# a wrapper that notes the command it runs, then becomes it (as valgrind does)
WRAPPER = """
import os, sys
with open(sys.argv[1], "a") as noted:
    noted.write(os.path.basename(sys.argv[2]) + " " + str(os.getpid()) + "\\n")
os.execv(sys.argv[2], sys.argv[2:])
"""


def test_every_daemon_runs_under_the_command_and_is_its_process(tmp_path: Path) -> None:
    wrapper, noted = tmp_path / "wrapper.py", tmp_path / "noted.txt"
    wrapper.write_text(WRAPPER)
    spec = mp.ClusterSpec.simple(2, enable_spu=False)
    with mp.local_cluster(
        spec, run_dir=tmp_path / "lc", run_under=(sys.executable, str(wrapper), str(noted))
    ) as ctx:
        assert mp.fetch(mp.device("P1")(lambda: 41)()) == 41
        procs = ctx.processes
        assert procs.broker is not None
        pids = {procs.broker.pid: "mpl-broker"}
        pids.update({p.pid: "mpl-worker" for p in procs.workers.values()})
    lines = noted.read_text().split()
    assert {int(pid): name for name, pid in zip(lines[::2], lines[1::2], strict=True)} == pids
