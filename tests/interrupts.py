"""Ctrl-C in a test: a real SIGINT to the main thread once the broker runs the job.

A waiting future blocks in a lock, which only a real signal interrupts
(``_thread.interrupt_main`` waits for the next bytecode).
"""

from __future__ import annotations

import signal
import threading

from helpers import wait_until

from mpl.broker.query import query_status


def jobs_in_flight(address: str) -> int:
    """The broker's count of jobs in flight."""
    return int(query_status(address, timeout=5)["jobs_in_flight"])


def interrupt_once_running(address: str) -> threading.Thread:
    """A started thread that waits for one job in flight at the broker at ``address``,
    then sends SIGINT (what Ctrl-C sends) to the main thread."""

    def interrupt() -> None:
        wait_until(lambda: jobs_in_flight(address) == 1, 30, "the job to start")
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread
