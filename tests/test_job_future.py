"""``JobFuture``, the future ``mp.submit`` returns: a ``concurrent.futures.Future`` to every
reader (``result``, ``exception``, ``wait``, ``as_completed``, callbacks), settled in one
pass by :func:`~mpl.driver.job_future.settle` without losing a waiter."""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from typing import Any

import pytest
from helpers import blocked_in_wait

from mpl.driver.job_future import JobFuture, settle


def _started(target: Any) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def test_a_job_future_is_a_running_future() -> None:
    f = JobFuture()
    assert isinstance(f, Future)
    assert f.running() and not f.done()
    assert not f.cancel()  # a job handed over is not taken back


def test_settle_wakes_a_thread_blocked_in_result() -> None:
    f = JobFuture()
    got: list[Any] = []
    t = _started(lambda: got.append(f.result(timeout=10)))
    blocked_in_wait(t)
    settle([(f, 42)])
    t.join(10)
    assert got == [42]
    assert f.done() and f.result() == 42 and f.exception() is None


def test_settle_wakes_wait_and_as_completed_and_runs_callbacks() -> None:
    futures = [JobFuture() for _ in range(4)]
    seen: list[Any] = []
    futures[2].add_done_callback(lambda fut: seen.append(fut.result()))
    firsts: list[Any] = []
    order: list[Any] = []
    waiter = _started(lambda: firsts.append(wait(futures, 10, FIRST_COMPLETED)))
    reader = _started(lambda: order.extend(f.result() for f in as_completed(futures, 10)))
    blocked_in_wait(waiter)
    blocked_in_wait(reader)
    settle([(futures[2], "c")])
    waiter.join(10)
    assert firsts and firsts[0].done == {futures[2]}
    settle([(f, i) for i, f in enumerate(futures) if i != 2])
    reader.join(10)
    assert sorted(map(str, order)) == ["0", "1", "3", "c"]
    assert seen == ["c"]


def test_settle_leaves_a_failed_future_failed() -> None:
    f = JobFuture()
    f.set_exception(ValueError("first"))
    settle([(f, "late")])
    with pytest.raises(ValueError, match="first"):
        f.result(timeout=0)


def test_a_result_not_yet_there_still_times_out() -> None:
    with pytest.raises(TimeoutError):
        JobFuture().result(timeout=0.01)
