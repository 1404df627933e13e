"""Daemons started by a driver die with it (Linux): no orphans after a crashed driver.

The launcher sets ``MPL_PARENT_PID``; the daemon exits at once if that process is already
gone, and otherwise a watcher thread SIGTERMs the daemon (a clean shutdown) as soon as it
goes: it waits on a pidfd of the parent (no wake-ups), or, where pidfds are missing, checks
the parent every half second. Not ``PR_SET_PDEATHSIG``: that fires when the *thread* that
started the daemon ends, so a daemon (re)started from a short-lived thread was killed at
once. Done in the daemon rather than in a pre-exec hook: forking a process that has
imported jax with a Python hook makes jax warn about deadlocks.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

__all__ = ["PARENT_ENV", "die_with_parent"]

PARENT_ENV = "MPL_PARENT_PID"
_POLL_S = 0.5


def die_with_parent() -> None:
    expected = os.environ.get(PARENT_ENV)
    if not expected:
        return
    parent = int(expected)
    if os.getppid() != parent:  # the parent died before we got here
        raise SystemExit(f"the process that started this daemon (pid {expected}) is gone")
    threading.Thread(target=_watch, args=(parent,), name="mpl-parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfds here (or the parent just went): poll
        while os.getppid() == parent:
            time.sleep(_POLL_S)
    else:
        select.select([fd], [], [])  # readable once the parent has exited
        os.close(fd)
    os.kill(os.getpid(), signal.SIGTERM)
