"""A worker under construction: nothing that arrives may reach parts not built yet.

The SPU link's thread delivers what arrives on the link's socket, and its callbacks read
the worker's state (how many ranks may send) and its job shell (whether a job stopped).
The link is built before them (the state's hello carries the link's address), so its
thread must not run until they exist: here a message reaches the link while the worker
is still building its state."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from helpers import wait_until

import mpl.worker.daemon as daemon
from mpl.worker.spu_link import SPU_MAGIC
from mpl.worker.state import WorkerState

_RANK = 13  # names the link thread mpl-spu-13: no other test's worker has that rank
_LANE = "s/spu/x/0"


def _link_thread() -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == f"mpl-spu-{_RANK}"), None)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    made: zmq.Context[Any] = zmq.Context()
    yield made
    made.term()


def test_an_spu_message_during_construction_waits_for_the_worker_state(
    ctx: zmq.Context[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    early: dict[str, Any] = {}
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)

    class StateBuiltLate(WorkerState):
        """The worker's state, built only after an SPU message reached the link (and, if
        the link's thread already runs, after that thread had a chance to deliver it)."""

        def __init__(self, hello: Any, **kwargs: Any) -> None:
            push.connect(hello.spu_addr)
            push.send_multipart([SPU_MAGIC, _LANE.encode(), b"0", b"k", b"early"])
            thread = _link_thread()
            early["thread_ran"] = thread is not None and thread.is_alive()
            if early["thread_ran"]:
                # before the fix: the thread reads self.state (not there yet) and dies
                assert thread is not None
                deadline = time.monotonic() + 3.0
                while thread.is_alive() and time.monotonic() < deadline:
                    thread.join(0.05)
            super().__init__(hello, **kwargs)

    monkeypatch.setattr(daemon, "WorkerState", StateBuiltLate)
    worker = daemon.Worker("tcp://127.0.0.1:9", _RANK, context=ctx)  # no broker needed
    try:
        assert not early["thread_ran"], "the SPU link's thread ran before the worker's state"
        thread = _link_thread()
        assert thread is not None and thread.is_alive()
        # the message is held (its lane not open yet) and taken once it is
        links = worker.spu_links
        wait_until(lambda: links.mailbox.held() == 1, what="the early SPU message to be held")
        links.open_lane(_LANE)
        data = links.recv(_LANE, 0, "k", ("s", "j"), time.monotonic() + 5.0)
        assert data == b"early"
        assert thread.is_alive() and links.protocol_errors == 0
    finally:
        push.close()
        worker.close()
