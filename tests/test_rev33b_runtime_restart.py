"""Review w33: a worker's runtime_info of a previous broker's sessions is freed when a new
broker welcomes it.

A worker keeps each open session's runtime_info within one budget
(``MAX_RUNTIME_INFO_TOTAL``) and frees a session's when its ``SessionClosed`` comes. A
restarted broker has no sessions and sends no SessionClosed for the old ones: the worker
closed their values and jobs (``CloseAll``) but kept their runtime_info, which went on
holding the budget (up to 10,000 newer sessions later), so genuine opens bringing their
own runtime_info were refused on that node after the restart.

A real ``Worker`` (no broker behind its address), given the action its state machine
emits on a new broker's Welcome.
"""

from __future__ import annotations

import socket
from typing import Any

import zmq

from mpl.wire.sessions import SessionRuntime
from mpl.worker.daemon import Worker
from mpl.worker.state_events import CloseAll


def _unused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_new_broker_frees_the_runtime_info_of_the_old_ones_sessions() -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    worker = Worker(_unused_address(), 0, context=ctx)
    try:
        for n in range(3):
            worker.runtimes.open(SessionRuntime(f"old{n}", 0, {"blob": f"{n}" + "x" * 1000}))
        worker.runtimes.open(SessionRuntime("refused", 0, {"version": "99.0"}))
        assert len(worker.runtimes) == 3 and worker.runtimes.weight > 3000
        assert worker.runtimes.refused_sessions
        worker._perform([CloseAll("the broker restarted")])
        assert len(worker.runtimes) == 0 and worker.runtimes.weight == 0
        assert not worker.runtimes.refused_sessions
        # and the table works on: a new session's is kept and counted
        worker.runtimes.open(SessionRuntime("new", 0, {"blob": "y" * 100}))
        assert len(worker.runtimes) == 1 and worker.runtimes.weight > 100
    finally:
        worker.close()
        ctx.term()
