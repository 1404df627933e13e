"""Review w29-b of this round's perf changes on hostile input (secure, fan, tail): the
findings, each a strict xfail until the lead fixes it.

* Finding 1 (low, tail): a worker's own version is looked up when the first session brings
  runtime_info, not as it starts: a node whose package was upgraded under a running worker
  says it runs the new version, and serves sessions that ask for it with the old code.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from pathlib import Path

import pytest

from mpl.worker.session_runtime import SessionRuntimes


@pytest.mark.xfail(
    strict=True,
    reason="review w29-b finding 1: SessionRuntimes looks its version up at the first "
    "session, not at start: a package upgraded under a running worker is what it claims",
)
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
