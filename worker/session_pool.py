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
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

__all__ = ["SessionPool"]

log = logging.getLogger("mpl.worker")
_IDLE_S = 30.0  # a thread without work this long ends (it is started again on demand)

Task = Callable[[], None]


class SessionPool:
    """Run ``submit``ted tasks on at most ``max_threads`` threads, in order per session."""

    def __init__(self, max_threads: int, name: str = "mpl-job") -> None:
        if max_threads < 1:
            raise ValueError(f"a job pool needs at least one thread, got {max_threads}")
        self.max_threads = max_threads
        self._name = name
        self._cond = threading.Condition()
        self._queues: dict[str, collections.deque[Task]] = {}  # sessions with work
        self._ready: collections.deque[str] = collections.deque()  # ... not being run now
        self._threads = 0
        self._idle = 0
        self._made = 0
        self.peak_threads = 0  # the most threads alive at once, for status and tests

    def submit(self, sid: str, task: Task) -> None:
        with self._cond:
            queue = self._queues.get(sid)
            if queue is None:
                queue = self._queues[sid] = collections.deque()
                self._ready.append(sid)  # absent from _queues: neither queued nor running
            queue.append(task)
            if self._idle:
                self._cond.notify()
            elif self._threads < self.max_threads:
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

    def _start(self) -> None:
        self._threads += 1
        self._made += 1
        self.peak_threads = max(self.peak_threads, self._threads)
        name = f"{self._name}-{self._made}"
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._ready:
                    self._idle += 1
                    woken = self._cond.wait(_IDLE_S)
                    self._idle -= 1
                    if not woken and not self._ready:
                        self._threads -= 1
                        return
                sid = self._ready.popleft()
                task = self._queues[sid].popleft()
            try:
                task()
            except BaseException:  # tasks report their own errors; the thread must not die
                log.exception("session %s: task crashed", sid)
            with self._cond:
                if self._queues[sid]:
                    self._ready.append(sid)  # its turn again after the others waiting
                    self._cond.notify()
                else:
                    del self._queues[sid]
