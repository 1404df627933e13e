"""Third red team w32, finding R32-6 (low): sessions' runtime_info pins memory in workers.

A session opened with its own spec brings each named node's ``runtime_info``, which the
broker relays to that node's worker (``SessionRuntime``, the broker's word, not sealed).
Each is bounded (1,024 keys and values, 64 KiB of text) and the worker keeps one per
session for up to ``MAX_SESSIONS`` (10,000) sessions, but with no budget over them all:
about 66 MB per 1,000 sessions, so some 660 MB in every worker from a hostile broker
inventing sessions. (Through an honest broker a listed driver holds at most 256 open
sessions, ``broker/access.py`` ``MAX_OWNED``: about 17 MB per driver.) An idle worker is
about 27 MiB.

Strict xfail: a budget needs a decision (total text over all sessions, per driver, and
what a genuine open gets once a hostile one used it up), at the broker and the worker.
"""

from __future__ import annotations

import tracemalloc

import pytest

from mpl.wire.codec import decode, encode
from mpl.wire.sessions import SessionRuntime
from mpl.worker.session_runtime import SessionRuntimes

_BUDGET = 16 << 20  # what a worker might keep for all sessions' runtime_info


@pytest.mark.xfail(strict=True, reason="R32-6: no budget over all sessions' runtime_info")
def test_sessions_runtime_info_stays_within_a_budget() -> None:
    runtimes = SessionRuntimes(0, lambda: {})
    info = {f"k{i:05d}" + "x" * 56: "v" * 62 for i in range(500)}  # within both bounds
    assert runtimes.refusal(info) is None
    tracemalloc.start()
    try:
        for n in range(400):  # of the 10,000 sessions a broker may hold
            msg = decode(encode(SessionRuntime(f"s{n}", 0, info)))  # as a worker gets it
            assert isinstance(msg, SessionRuntime)
            runtimes.open(msg)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(runtimes) == 400
    assert kept <= _BUDGET, f"{kept >> 20} MiB kept for 400 sessions' runtime_info"
