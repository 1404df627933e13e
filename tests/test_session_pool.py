"""The worker's job threads: a bounded pool that keeps each session's tasks in order."""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

from helpers import nap, wait_until

from mpl.wire import GraphBuilder
from mpl.worker.session_pool import SessionPool, owner_share


def test_many_sessions_share_a_bounded_number_of_threads_in_order_per_session() -> None:
    pool = SessionPool(3)
    gate = threading.Event()
    ran: dict[str, list[int]] = {}
    lock = threading.Lock()

    def task(sid: str, i: int) -> None:
        gate.wait(10)
        with lock:
            ran.setdefault(sid, []).append(i)

    sessions = [f"s{n}" for n in range(20)]
    for i in range(5):
        for sid in sessions:
            pool.submit(sid, partial(task, sid, i))
    wait_until(lambda: pool.threads == 3, what="the pool to fill")
    assert pool.peak_threads == 3  # before: one thread per session, 20 here
    gate.set()
    wait_until(lambda: not pool.sessions(), what="every task to run")
    assert ran == {sid: [0, 1, 2, 3, 4] for sid in sessions}
    assert pool.peak_threads == 3


def test_a_session_never_runs_on_two_threads_at_once() -> None:
    pool = SessionPool(4)
    running = [0]
    overlap = [0]
    lock = threading.Lock()

    def task() -> None:
        with lock:
            running[0] += 1
            overlap[0] = max(overlap[0], running[0])
        time.sleep(0.001)  # work, not a wait for a condition
        with lock:
            running[0] -= 1

    for _ in range(50):
        pool.submit("one", task)
    wait_until(lambda: not pool.has_work("one"), what="the session's tasks")
    assert overlap[0] == 1


def test_a_task_that_raises_leaves_its_thread_and_session_working() -> None:
    pool = SessionPool(1)
    done = threading.Event()

    def boom() -> None:
        raise SystemExit("user code called sys.exit()")

    pool.submit("s", boom)
    pool.submit("s", done.set)
    assert done.wait(5)


def test_sessions_beyond_the_pool_wait_for_a_thread(make_cluster: Any) -> None:
    cluster = make_cluster("inproc")
    worker = cluster.impl.workers[0]
    worker.jobs._pool.max_threads = 2  # a small pool, so a few sessions exceed it
    client = cluster.client()
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(nap), args=(0.3,))[0]
    graph = b.build([x])
    sids = [client.open_session().session for _ in range(5)]
    futures = [client.submit_async(sid, graph, {}, inline=(0,), timeout=30) for sid in sids]
    for f in futures:
        assert f.result(timeout=30).values[0] == {0: 0.3}
    assert worker.jobs._pool.peak_threads == 2


def test_no_owner_holds_more_than_its_share_while_anothers_task_waits() -> None:
    pool = SessionPool(4)
    assert pool.share == owner_share(4) == 3
    gate = threading.Event()
    ran: list[str] = []
    lock = threading.Lock()

    def held(name: str) -> None:
        gate.wait(10)
        with lock:
            ran.append(name)

    for n in range(6):  # one owner's tasks that hold their threads, a session each
        pool.submit(f"a{n}", partial(held, f"a{n}"), "a")
    wait_until(lambda: pool.held() == {"a": 3}, what="owner a's share to run")
    other = threading.Event()
    pool.submit("b", other.set, "b")
    assert other.wait(10)  # a thread is left for another owner's task
    assert pool.held() == {"a": 3}  # a's other three parked, on no thread
    gate.set()
    wait_until(lambda: not pool.sessions(), what="every task to run")
    assert sorted(ran) == [f"a{n}" for n in range(6)]
    assert pool.held() == {} and not pool._parked
    assert pool.peak_threads <= 4


def test_a_parked_sessions_tasks_still_run_in_order() -> None:
    pool = SessionPool(2)  # share 2: owner a holds both threads, then its third waits
    gate = threading.Event()
    ran: list[int] = []

    def task(i: int) -> None:
        gate.wait(10)
        ran.append(i)

    for sid in ("x", "y"):
        pool.submit(sid, partial(task, -1), "a")
    wait_until(lambda: pool.held() == {"a": 2}, what="both threads taken")
    for i in range(5):
        pool.submit("z", partial(task, i), "a")
    gate.set()
    wait_until(lambda: not pool.sessions(), what="every task to run")
    assert [i for i in ran if i >= 0] == [0, 1, 2, 3, 4]
