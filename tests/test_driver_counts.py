"""What the driver does per synchronous job, counted: Python calls on the calling thread.

The driver's CPU per trivial job (trace-cache hit, the Exec packed and sent, the JobResult
read, the output fetched from what came back inline) is mostly Python calls; this pins
their number (never a time) under the in-process Simulator, where the driver's code path is
the one it takes against real daemons.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import call_counter, run_profiled

import mpl.driver as mp
from mpl.driver.values import NOT_CACHED
from mpl.wire.codec import encode
from mpl.wire.exec_pack import exec_frames
from mpl.wire.jobs import Exec

WORLD_SIZE = 2
# main (14e5dcc) made 53 Python calls per job here, 68feee1 46 (44, plus the check whether
# an answer is a batch), e7b802d 33 (a call without arguments finds its trace without a key,
# the job's wait reads its JobResult on a path of its own, the deletes are packed in one
# call), 31 at f226f8d (a short JobResult is read without a Decoder), now 9: the program's
# call site (mpl.driver.job_site) runs the job in one function, reads its own JobResult
# (read_result) and builds the one Value, and mp.fetch of one Value goes to it directly; the
# margin is for the batch of deletes (the jobs' dropped outputs) that may go out during the count
PER_JOB = 10
# an eager call without arguments (mp.device("P0")(fn)()) and its fetch: 57 calls per job at
# e7b802d (the arguments flattened, a plan key built and looked up, the device and its ranks
# found), 31 at f226f8d (its plan is the decorated function's own), now 10: the plan's call
# site runs the job (the margin is for the deletes)
PER_EAGER_JOB = 11
# mp.submit with 64 in flight, per job: the calling thread (submit, result, fetch) made 40
# calls at 68feee1, 21 at f226f8d, now 17 (a job id without a call; the margin is for the
# deletes); the pump thread (send, read, settle) 19 per job besides its per-wake-up loop at
# 68feee1, 13 at e7b802d, 11 (the JobResult read without a Decoder), 10.2 at 2357d5f, now
# 8.2 (the answer's bytes read without a view or a call to count their containers; a
# program returning one Value built from the answer without two calls), now 7.2 (a
# plaintext job's value taken in the receive loop, without _take's call).
PER_SUBMIT_CALLER = 19
PER_SUBMIT_PUMP = 8
# The pump's loop, run once per wake-up or per message (a batch carries many jobs): how the
# jobs fall into wake-ups and batches depends on timing, so these are not counted per job.
PER_WAKE_UP = frozenset(
    {
        "_poll_ms", "_send_queued", "_send_many", "_send", "_expire", "_receive", "settle",
        "drain", "recv_frames", "send_frames", "_compiled", "is_batch", "split_batch",
        "coalesce", "close_run", "batch_frames", "<listcomp>", "<genexpr>", "__call__",
        "__new__", "trusted", "pickles_allowed",
        # waking the caller blocked on a future: once per wake-up at most
        "notify_all", "notify", "__enter__", "__exit__",
    }
)  # fmt: skip


@pytest.fixture
def counted_ctx(sim: Any) -> Iterator[Any]:
    with sim:
        yield sim


def test_python_calls_per_sync_trivial_job_at_the_driver(counted_ctx: Any) -> None:
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(20):  # traced, program sent, caches warm
        assert mp.fetch(job()) == [1, 1]
    calls: Counter[str] = Counter()
    n = 50
    results = run_profiled(call_counter(calls, c_calls=False), lambda: mp.fetch(job()), n)
    assert results == [[1, 1]] * n
    per_job = sum(calls.values()) / n
    print(f"{per_job} Python calls per job: {calls.most_common(12)}")
    assert per_job <= PER_JOB


# From the answer's frame received to mp.fetch's return (the JobResult read and checked, the
# job booked, the Value built, fetched from what came back inline, dropped): what the
# driver does on the critical path after the last hand-off, counted as Python calls and
# calls of builtins (each a few hundred instructions or more). 25 at 209cfaa (6 Python
# calls: result_fields, _fits_plain, output_value, fetch, fetch_one, Value.__del__; 19
# builtins, two of them dict.values for a second pass over the values), now 22.
PER_ANSWER = 22


def test_calls_per_sync_trivial_job_from_its_answer_received_to_its_fetch(
    counted_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mpl.driver.job_site as job_site

    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(20):  # traced, program sent, caches warm
        assert mp.fetch(job()) == [1, 1]
    received = job_site._recv
    answering = [False]  # from the frame's receipt on the job site to mp.fetch's return

    def recv(*args: Any) -> Any:
        frame = received(*args)
        answering[0] = True
        return frame

    monkeypatch.setattr(job_site, "_recv", recv)
    calls: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if answering[0]:
            if event == "call":
                calls[frame.f_code.co_name] += 1
            elif event == "c_call":
                calls[f"C {arg.__qualname__}"] += 1

    n = 50
    results = []
    sys.setprofile(count)
    try:
        for _ in range(n):
            got = mp.fetch(job())
            answering[0] = False
            results.append(got)
    finally:
        sys.setprofile(None)
    assert results == [[1, 1]] * n
    per_job = sum(calls.values()) / n
    print(f"{per_job} calls per job after its answer: {calls.most_common(16)}")
    assert calls["recv"] == 0  # every answer came on the job site's first receive
    assert per_job <= PER_ANSWER


def test_python_calls_per_sync_eager_call_without_arguments(counted_ctx: Any) -> None:
    one = mp.device("P0")(lambda: 1)
    for _ in range(20):  # recorded, program sent, caches warm
        assert mp.fetch(one()) == 1
    calls: Counter[str] = Counter()
    count = call_counter(calls, c_calls=False)

    n = 50
    sys.setprofile(count)
    try:
        results = [mp.fetch(one()) for _ in range(n)]
    finally:
        sys.setprofile(None)
    assert results == [1] * n
    per_job = (sum(calls.values()) - calls["<listcomp>"]) / n
    print(f"{per_job} Python calls per eager job: {calls.most_common(12)}")
    assert per_job <= PER_EAGER_JOB


def test_an_exec_without_bindings_is_packed_without_walking_them() -> None:
    """Same bytes as encode, and no walk over the (empty) bindings."""
    msg = Exec("s" * 16, "j" * 24, "d" * 64, (0, 1), {}, (0,), 600.0)
    calls: Counter[str] = Counter()
    count = call_counter(calls, c_calls=False)

    sys.setprofile(count)
    try:
        frames = exec_frames(msg)
        frames = exec_frames(msg)  # the second: its parts cached
    finally:
        sys.setprofile(None)
    assert [bytes(f) for f in frames] == [bytes(f) for f in encode(msg)]
    assert calls["_pack_bindings"] == 0


def test_python_calls_per_submitted_job_on_the_caller_and_the_pump(counted_ctx: Any) -> None:
    job = mp.function(lambda: mp.device("P0")(lambda: 1)())
    counted_ctx.client.abandon_jobs("a pump started under the profiler follows")
    calls: dict[str, Counter[str]] = {"MainThread": Counter(), "mpl-driver-pump": Counter()}
    counting = threading.Event()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and counting.is_set():
            mine = calls.get(threading.current_thread().name)
            if mine is not None:
                mine[frame.f_code.co_name] += 1

    def windowed(n: int, window: int = 64) -> list[Any]:
        inflight: list[Any] = []
        out = []
        for _ in range(n):
            if len(inflight) >= window:
                out.append(mp.fetch(inflight.pop(0).result(timeout=60)))
            inflight.append(mp.submit(job))
        out += [mp.fetch(f.result(timeout=60)) for f in inflight]
        return out

    threading.setprofile(count)  # for the pump, which starts with the first submit
    try:
        assert windowed(200) == [1] * 200  # traced, program sent, caches warm
        n = 640
        sys.setprofile(count)
        counting.set()
        try:
            results = windowed(n)
        finally:
            counting.clear()
            sys.setprofile(None)
    finally:
        threading.setprofile(None)
    assert results == [1] * n
    caller = sum(calls["MainThread"].values()) / n
    pump_calls = calls["mpl-driver-pump"]
    pump = sum(v for k, v in pump_calls.items() if k not in PER_WAKE_UP) / n
    print(f"per job: caller {caller}, pump {pump}: {pump_calls.most_common(16)}")
    assert 0 < pump <= PER_SUBMIT_PUMP
    assert caller <= PER_SUBMIT_CALLER


def test_an_output_value_is_the_value_init_makes() -> None:
    """output_value (a job's output, filled without __init__) sets every slot as __init__
    would: the same Value, not one missing a field."""
    from mpl.driver.values import Value, output_value

    made = output_value("P0", (0,), None, "j/0", {0: 1}, "int")  # type: ignore[arg-type]
    init = Value("P0", (0,), ctx=None, uri="j/0", owned=True, cache={0: 1}, meta="int")
    slots = [s for s in Value.__slots__ if s != "__weakref__"]
    assert [getattr(made, s) for s in slots] == [getattr(init, s) for s in slots]
    empty = output_value(None, (0, 1), None, "j/1", None, "")  # type: ignore[arg-type]
    assert empty._cache == {} and empty.cached(0) is NOT_CACHED


def test_a_call_sites_answer_with_buffer_frames_is_received_whole(
    counted_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call site reads its answer's first frame without asking whether more follow
    only when msgpack alone reads it (no buffer referred to); an answer carrying an array
    inline (its data a buffer frame) is received whole (more frames asked for), and the
    next job's answer is its own."""
    import numpy as np

    import mpl.driver.job_site as job_site

    asked: list[Any] = []
    get = job_site._get

    def counted(*args: Any) -> Any:
        more = get(*args)
        asked.append(more)
        return more

    received: list[type] = []
    recv = job_site._recv

    def typed(*args: Any) -> Any:
        got = recv(*args)
        received.append(type(got))
        return got

    monkeypatch.setattr(job_site, "_get", counted)
    monkeypatch.setattr(job_site, "_recv", typed)
    array = mp.function(lambda: mp.device("P0")(lambda: np.arange(20.0))())
    small = mp.function(lambda: mp.device("P0")(lambda: 7)())
    for _ in range(3):
        got = mp.fetch(array())
        assert got.shape == (20,) and got[-1] == 19.0
        assert mp.fetch(small()) == 7
    assert asked == [1, 0] * 2  # each array's answer after the first: one more frame
    asked.clear()
    received.clear()
    for _ in range(5):
        assert mp.fetch(small()) == 7
    assert asked == []  # read alone
    assert received == [bytes] * 5  # received as bytes: no zmq.Frame built for it
