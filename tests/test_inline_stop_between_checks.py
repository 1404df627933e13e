"""An abort that lands while the I/O thread begins a repeat quick job inline.

``WorkerState.begin_inline`` runs on the I/O thread without the lock; the peer thread
(``--code kernels``: a refused move, ``MoveRefused``) records aborts meanwhile, under the
lock. Whatever abort is recorded before the job's run ends must be seen by the look after
the run (``Jobs.run_now``): then the job posts no ``Done`` and its outputs are freed, as
its ``FreeJob`` ran before they were stored. 371bb90 looks at ``aborted`` again after the
run. This code looks again only if ``stops`` moved since ``begin_inline`` read it; it read
it after its own look at ``aborted`` (found in review, round 16), so an abort recorded
between the two was seen by neither: now it is read before the look, and bumped after the
entry, so an abort recorded at any moment is seen by one of them.

The peer thread's report is delivered right after ``begin_inline``'s lookup, by the
table itself: the scheduling a GIL switch may give there, made deterministic.
"""

from __future__ import annotations

from typing import Any

import pytest

from mpl.wire.control import Welcome, WorkerHello
from mpl.wire.graph import Graph, GraphBuilder
from mpl.wire.jobs import Done, Exec, Program
from mpl.wire.lru import LRU
from mpl.wire.remote import ErrorInfo
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.state import WorkerState
from mpl.worker.state_events import MoveRefused, RunFinished
from mpl.worker.store import ObjectStore

RANK = 0


def _seven() -> int:
    return 7


def _seven_in_a_tuple() -> tuple[int]:
    return (7,)


def _graph(*, compiled: bool) -> Graph:
    """A local program of one pcall returning 7 (which the job shell runs compiled, and in
    w27-worker answers from its Done template), or one behind a getitem (which it does not
    compile)."""
    b = GraphBuilder(2)
    (out,) = b.op("pcall", [], ranks=(RANK,), fn=b.fn(_seven if compiled else _seven_in_a_tuple))
    if not compiled:
        (out,) = b.op("getitem", [out], ranks=(RANK,), key=0)
    return b.build([out])


class _AbortedWithPeer(LRU[tuple[str, str], str]):
    """The state's table of aborted jobs; once ``target`` is looked up and absent, the peer
    thread's report of a refused move for it arrives (``deliver``), just after the look."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.target: tuple[str, str] | None = None
        self.deliver: Any = None
        self.delivered = 0

    def __contains__(self, key: object) -> bool:
        found = super().__contains__(key)
        if not found and key == self.target:
            self.target = None
            self.delivered += 1
            self.deliver()
        return found


@pytest.mark.parametrize("compiled", [True, False])
def test_an_abort_recorded_while_a_job_begins_inline_is_seen_after_its_run(
    compiled: bool,
) -> None:
    hello = WorkerHello(RANK, "inc", 1, "h", "tcp://d", "", [])
    state = WorkerState(hello, now=0.0, heartbeat_s=1.0)
    state.handle(Welcome(RANK, 2, "B1", 1.0, {}), 0.0)
    aborted = _AbortedWithPeer(state.aborted.limit)
    aborted[("other", "x")] = "an earlier abort"  # the table is not empty
    state.aborted = aborted
    state.inline_s = 60.0  # counts, not time: no run on a busy machine is "slow"
    posted: list[Any] = []
    shell = Jobs(state, ObjectStore(), move_mailbox(), None, posted.append)  # type: ignore[arg-type]
    graph = _graph(compiled=compiled)
    state.handle(Program(graph.digest, graph), 0.0)
    state.handle(Exec("s", "1", graph.digest, (0, 1), {}, (0,)), 1.0)
    state.handle(RunFinished("s", "1", 0.01, Done("s", "1", RANK)), 1.1)  # quick from now
    assert shell.run_now(Exec("s", "2", graph.digest, (0, 1), {}, (0,)))  # inline
    assert [(type(m), m.job) for m in posted] == [(Done, "2")]

    refused = MoveRefused("s", "3", ErrorInfo("RemoteError", "a move held pickles"))
    aborted.deliver = lambda: shell.report(refused)  # the peer thread's path (Worker._move_refused)
    aborted.target = ("s", "3")
    assert shell.run_now(Exec("s", "3", graph.digest, (0, 1), {}, (0,)))
    assert aborted.delivered == 1, "the peer's report was not delivered"
    kinds = [(type(m).__name__, m.job) for m in posted[1:]]
    assert kinds == [("Failed", "3")], f"an aborted job answered: {kinds}"
    assert not shell.store.has("s", "3/0"), "an aborted job's outputs were kept"
