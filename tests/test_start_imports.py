"""What a plain (no keys) start loads: nothing only secure mode or a rare request needs.

The ZAP handler (pyzmq's ``zmq.auth.thread``, which brings in asyncio, ssl and subprocess)
and end-to-end sealing (the ``cryptography`` package) serve CURVE clusters only; the scan
of installed kernel packages (``importlib.metadata``, with email and zipfile) runs on the
first lookup of a kernel by id. Each cost the start of every plaintext daemon tens of
milliseconds. Checked as module counts: in a fresh interpreter for the imports, and in the
memory maps of real daemons (their compiled modules) for a start that ran a job.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import mpl.driver as mp

# modules (and their packages' submodules) only a secure daemon needs
_SECURE_ONLY = ("asyncio", "ssl", "cryptography", "zmq.auth.thread", "mpl.wire.zap")
_SEALING = ("mpl.wire.seal", "mpl.wire.seal_box", "mpl.worker.sealing")
_KERNEL_SCAN = ("importlib.metadata", "zipfile", "email")
# compiled modules the same imports map into a process (parts of their paths)
_SECURE_ONLY_LIBRARIES = ("/_asyncio.", "/_ssl.", "/cryptography/")


def _loaded(code: str, banned: tuple[str, ...]) -> list[str]:
    """The modules of ``banned`` (or under them) loaded after ``code`` in a fresh process."""
    probe = (
        f"{code}; import sys; banned = {banned!r}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in banned or m in banned "
        "or any(m.startswith(b + '.') for b in banned)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return list(eval(out.stdout))  # a printed list of str, from our own probe


@pytest.mark.parametrize("module", ["mpl.broker.cli", "mpl.broker.daemon"])
def test_a_broker_imports_no_secure_only_module(module: str) -> None:
    assert _loaded(f"import {module}", _SECURE_ONLY) == []


@pytest.mark.parametrize("module", ["mpl.worker.cli", "mpl.worker.daemon"])
def test_a_worker_imports_no_secure_only_module_nor_the_kernel_scan(module: str) -> None:
    assert _loaded(f"import {module}", _SECURE_ONLY + _SEALING + _KERNEL_SCAN) == []


def test_a_plain_worker_built_has_not_asked_its_package_metadata() -> None:
    """Its own version (importlib.metadata's search of every installed distribution) is
    looked up when a session first brings runtime_info to check, not as a worker starts."""
    code = (
        "from mpl.worker.daemon import Worker; "
        "w = Worker('tcp://127.0.0.1:9', 0); w.close()"  # nothing listens there: no join
    )
    assert _loaded(code, _KERNEL_SCAN) == []


def _libraries(pid: int) -> set[str]:
    """The paths of the shared objects mapped into process ``pid``."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-1] for line in maps.splitlines() if ".so" in line}


def test_plain_daemons_that_ran_a_job_map_no_secure_only_library(tmp_path: Path) -> None:
    with mp.local_cluster(2, run_dir=tmp_path) as ctx:
        both = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
        assert list(mp.fetch(both())) == [1, 1]
        procs = ctx.processes
        assert procs is not None and procs.broker is not None
        pids = [procs.broker.pid, *(p.pid for p in procs.workers.values())]
        mapped = {pid: sorted(_libraries(pid)) for pid in pids}
    found = {
        pid: [Path(so).name for so in libs if any(part in so for part in _SECURE_ONLY_LIBRARIES)]
        for pid, libs in mapped.items()
    }
    assert found == {pid: [] for pid in pids}, found
