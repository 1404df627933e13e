"""How much Python a secure worker runs per fetch of a value it holds: counted, not timed.

A driver's fetch of a value on a worker (a result too large to come inline, an SPU share)
takes the worker's I/O thread through the seal's inbound, the state, the job shell's
answer, the seal's ``reply`` (the value sealed for the ``Fetch`` it answers) and out. The
worker-side calls of that path are counted here, so a change that adds calls shows up,
whatever the machine's speed."""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import numpy as np
from test_worker_calls import secure  # noqa: F401  # the secure cluster on threads

from mpl.broker.daemon import Broker
from mpl.wire import GraphBuilder
from mpl.wire.codec import decode
from mpl.wire.data import Fetch
from mpl.wire.jobs import output_uri
from mpl.worker.daemon import Worker

_FETCHES = 40
# the worker's own calls (mpl.worker, and the LRU a table of Fetches would set) and the
# dataclasses built with their __init__ (records, the state's events and actions), per
# fetch of a held array, on the I/O thread: 24 and 6 since each reply is sealed by the
# Fetch it answers; the code before (the Fetch kept by its req in an LRU, its Reply built
# by the job shell, then built again sealed by the seal's outbound) counts 25 and 7. Half
# a call of margin.
_MAX_CALLS_PER_FETCH = 24.5
_MAX_RECORDS_PER_FETCH = 6.5


def test_a_secure_fetch_is_sealed_by_its_own_fetch_in_a_bounded_number_of_calls(
    secure: tuple[Broker, list[Worker], Any],  # noqa: F811
) -> None:
    _, workers, ctx = secure
    worker = workers[0]
    b = GraphBuilder(2)
    graph = b.build([b.op("constant", [], ranks=(0,), value=np.arange(3.0))[0]])
    uri = output_uri(ctx.client.submit(ctx.session, graph, {}).job, 0)
    for _ in range(3):
        assert ctx.client.fetch(ctx.session, 0, uri).tolist() == [0.0, 1.0, 2.0]
    calls: Counter[str] = Counter()
    fetches = [0]
    handle = worker._on_frames

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        path = code.co_filename.replace("\\", "/")
        if "/mpl/worker/" in path or path.endswith("/lru.py"):
            calls[f"{path.rsplit('/', 1)[-1]}:{code.co_name}"] += 1
        elif path == "<string>" and code.co_name == "__init__":  # a dataclass record's
            calls["records built"] += 1

    def counted(frames: list[Any]) -> None:
        try:
            fetch = type(decode([bytes(f) for f in frames], unpickle=False)) is Fetch
        except Exception:
            fetch = False
        if not fetch:  # a heartbeat, say
            handle(frames)
            return
        fetches[0] += 1
        sys.setprofile(count)
        try:
            handle(frames)
        finally:
            sys.setprofile(None)

    worker._on_frames = counted  # type: ignore[method-assign]  # the handler, counted
    try:
        for _ in range(_FETCHES):
            assert ctx.client.fetch(ctx.session, 0, uri).tolist() == [0.0, 1.0, 2.0]
    finally:
        worker._on_frames = handle  # type: ignore[method-assign]  # put back
    assert fetches[0] == _FETCHES
    records = calls.pop("records built", 0) / _FETCHES
    per_fetch = sum(calls.values()) / _FETCHES
    assert per_fetch <= _MAX_CALLS_PER_FETCH, f"{per_fetch:.1f} calls: {sorted(calls.items())}"
    assert records <= _MAX_RECORDS_PER_FETCH, f"{records:.1f} records built per fetch"
    assert calls["sealing.py:reply"] == _FETCHES  # sealed for the Fetch it answers
    assert calls["lru.py:__setitem__"] == 0  # kept in no table by the broker's req
