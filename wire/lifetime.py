"""Daemons started by a driver die with it (Linux): no orphans after a crashed driver.

The launcher sets ``MPL_PARENT_PID``; the daemon asks the kernel for SIGTERM when its parent
goes away (``PR_SET_PDEATHSIG``), and exits at once if the parent is already gone. Done in
the daemon rather than in a pre-exec hook: forking a process that has imported jax with a
Python hook makes jax warn about deadlocks.
"""

from __future__ import annotations

import ctypes
import os
import signal

__all__ = ["PARENT_ENV", "die_with_parent"]

PARENT_ENV = "MPL_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    expected = os.environ.get(PARENT_ENV)
    if not expected:
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the launcher still stops us by pid
        return
    if os.getppid() != int(expected):  # the parent died before we got here
        raise SystemExit(f"the process that started this daemon (pid {expected}) is gone")
