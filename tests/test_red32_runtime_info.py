"""Third red team w32, finding R32-6 (low): sessions' runtime_info pins memory in workers.

A session opened with its own spec brings each named node's ``runtime_info``, which the
broker relays to that node's worker (``SessionRuntime``, the broker's word, not sealed).
Each is bounded (1,024 keys and values, 64 KiB of text) and the worker keeps one per
session for up to ``MAX_SESSIONS`` (10,000) sessions, but with no budget over them all:
about 66 MB per 1,000 sessions, so some 660 MB in every worker from a hostile broker
inventing sessions. (Through an honest broker a listed driver holds at most 256 open
sessions, ``broker/access.py`` ``MAX_OWNED``: about 17 MB per driver.) An idle worker is
about 27 MiB.

Closed: a worker keeps all sessions' runtime_info within ``MAX_RUNTIME_INFO_TOTAL``
(``worker/session_runtime.py``): sessions bringing equal runtime_info share one copy, and
an open whose runtime_info does not fit is refused with a ``ClusterSpecError`` saying so,
which fails that open at its driver; sessions already open keep theirs.
"""

from __future__ import annotations

import tracemalloc

from mpl.wire.codec import decode, encode
from mpl.wire.jobs import Exec
from mpl.wire.sessions import SessionRuntime
from mpl.worker.session_runtime import SessionRuntimes

_BUDGET = 16 << 20  # what a worker might keep for all sessions' runtime_info


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


def test_an_open_past_the_budget_is_refused_and_the_open_ones_keep_working() -> None:
    """Distinct runtime_info (nothing to share): the opens past the budget are refused,
    each with an error for its driver; the sessions kept keep theirs; a close makes room."""
    budget = 1 << 20
    runtimes = SessionRuntimes(0, lambda: {}, budget=budget)

    def info(n: int) -> dict[str, str]:
        return {f"k{i:05d}" + "x" * 56: f"{n:08d}" + "v" * 54 for i in range(500)}

    answers = [runtimes.open(SessionRuntime(f"s{n}", n + 1, info(n))) for n in range(40)]
    kept = [a for a in answers if a is not None and a.error is None]
    refused = [a for a in answers if a is not None and a.error is not None]
    assert kept and refused and len(kept) + len(refused) == 40
    assert runtimes.weight <= budget and len(runtimes) == len(kept)
    error = refused[0].error
    assert error is not None and error.kind == "ClusterSpecError"
    assert "runtime_info" in error.message and "does not fit" in error.message
    first_refused = f"s{len(kept)}"
    assert runtimes.failed(Exec(first_refused, "j", "d", (0,), {}, (), 5.0)) is not None
    assert runtimes.of("s0") == info(0)  # a session kept keeps its own
    runtimes.closed("s0")
    again = runtimes.open(SessionRuntime(first_refused, 99, info(len(kept))))
    assert again is not None and again.error is None  # the close made room
    assert runtimes.of(first_refused) == info(len(kept))
