"""A bounded pool of job threads that keeps each session's tasks in order.

A worker runs work for many sessions at once, and a session's tasks (jobs, deletes, saves,
late fetches) must run one after another in arrival order: a job sees the outputs of the
jobs before it, and a delete never overtakes the job that still reads the value. One OS
thread per session would let the network decide how many threads a worker makes; here a
fixed number of threads serves every session, taking turns: a thread takes the next
session that has work, runs ONE of its tasks, and puts the session back at the end of the
line if more is queued. A session is never run by two threads at once.

When every thread is busy (jobs waiting on slow peers, say) further sessions wait for one;
each job still ends at its own deadline, so the wait is bounded. Threads are started on
demand and end after a while without work.

The threads are shared out by whom each task is for (its ``owner``: the driver the job came
from, as the caller knows it), as the holding area is by sender: no owner holds more than
:attr:`SessionPool.share` threads (the pool less a quarter no one owner may take), so jobs
of one driver waiting for moves a party never sends (each holds its thread until its
deadline) leave the rest of the pool to other drivers' work. A task past its owner's share
is not run: its session is parked under the owner (one entry per session, never per task:
bounded by the sessions with work, as the queues are) until a thread of that owner frees.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Hashable

__all__ = ["SessionPool", "owner_share"]

log = logging.getLogger("mpl.worker")
_IDLE_S = 30.0  # a thread without work this long ends (it is started again on demand)

Task = Callable[[], None]
Owner = Hashable  # whom a task is for: its threads are shared out by this


def owner_share(max_threads: int) -> int:
    """The threads one owner may hold of a pool of ``max_threads``: all but a quarter (48 of
    64), at least one."""
    return max(1, max_threads - max_threads // 4)


class SessionPool:
    """Run ``submit``ted tasks on at most ``max_threads`` threads, in order per session,
    at most :attr:`share` of them for any one owner's tasks."""

    def __init__(self, max_threads: int, name: str = "mpl-job") -> None:
        if max_threads < 1:
            raise ValueError(f"a job pool needs at least one thread, got {max_threads}")
        self.max_threads = max_threads
        self._name = name
        self._cond = threading.Condition()
        # sessions with work: each task with its owner
        self._queues: dict[str, collections.deque[tuple[Owner, Task]]] = {}
        self._ready: collections.deque[str] = collections.deque()  # ... not being run now
        self._held: dict[Owner, int] = {}  # threads running each owner's tasks (none: absent)
        # sessions whose next task's owner holds its share, in the order they were parked
        self._parked: dict[Owner, collections.deque[str]] = {}
        self._threads = 0
        self._idle = 0
        self._made = 0
        self.peak_threads = 0  # the most threads alive at once, for status and tests

    @property
    def max_threads(self) -> int:
        return self._max_threads

    @max_threads.setter
    def max_threads(self, threads: int) -> None:
        self._share = owner_share(threads)  # worked out here, not per task
        self._max_threads = threads

    @property
    def share(self) -> int:
        """The threads one owner's tasks may hold at once."""
        return self._share

    def submit(self, sid: str, task: Task, owner: Owner = None) -> None:
        """Run ``task`` after ``sid``'s tasks before it, on a thread counted to ``owner``."""
        with self._cond:
            queue = self._queues.get(sid)
            if queue is None:
                queue = self._queues[sid] = collections.deque()
                self._ready.append(sid)  # absent from _queues: neither queued nor running
            queue.append((owner, task))
            if self._idle:
                self._cond.notify()
            elif self._threads < self._max_threads:
                self._start()

    def has_work(self, sid: str) -> bool:
        """True while ``sid`` has tasks queued or running."""
        with self._cond:
            return sid in self._queues

    def sessions(self) -> list[str]:
        with self._cond:
            return list(self._queues)

    @property
    def threads(self) -> int:
        with self._cond:
            return self._threads

    def held(self) -> dict[Owner, int]:
        """The threads each owner's tasks hold now (owners holding none left out)."""
        with self._cond:
            return dict(self._held)

    def _start(self) -> None:
        self._threads += 1
        self._made += 1
        self.peak_threads = max(self.peak_threads, self._threads)
        name = f"{self._name}-{self._made}"
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                # a session whose next task's owner is under its share; sessions whose owner
                # holds it are parked (run once one of the owner's threads frees, below)
                while True:
                    while not self._ready:
                        self._idle += 1
                        woken = self._cond.wait(_IDLE_S)
                        self._idle -= 1
                        if not woken and not self._ready:
                            self._threads -= 1
                            return
                    sid = self._ready.popleft()
                    queue = self._queues[sid]
                    owner, task = queue[0]
                    held = self._held.get(owner, 0)
                    if held < self._share:
                        break
                    self._parked.setdefault(owner, collections.deque()).append(sid)
                queue.popleft()
                self._held[owner] = held + 1
            try:
                task()
            except BaseException:  # tasks report their own errors; the thread must not die
                log.exception("session %s: task crashed", sid)
            with self._cond:
                held = self._held[owner] - 1
                if held:
                    self._held[owner] = held
                else:
                    del self._held[owner]
                if self._parked:
                    self._unpark(owner)
                if queue:
                    self._ready.append(sid)  # its turn again after the others waiting
                    self._cond.notify()
                else:
                    del self._queues[sid]

    def _unpark(self, owner: Owner) -> None:
        """One of ``owner``'s threads freed: its first parked session's turn. Under the
        lock."""
        parked = self._parked.get(owner)
        if parked:
            self._ready.append(parked.popleft())
            if not parked:
                del self._parked[owner]
            self._cond.notify()
