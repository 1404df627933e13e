"""Job ids drawn in batches stay unguessable: distinct, full length, never shared with a fork."""

from __future__ import annotations

import subprocess
import sys
import threading

from mpl.driver.client import _JobIds


def test_ids_are_distinct_across_batches() -> None:
    ids = _JobIds()
    drawn = [ids.next() for _ in range(1000)]  # about four batches
    assert len(set(drawn)) == 1000
    assert all(len(j) == 24 and int(j, 16) >= 0 for j in drawn)


def test_threads_drawing_at_once_never_share_an_id() -> None:
    ids = _JobIds()
    drawn: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(mine: list[str]) -> None:
        start.wait(timeout=30)
        for _ in range(2000):  # several batches each, refilled while others draw
            mine.append(next(ids.pool, None) or ids.refill())

    threads = [threading.Thread(target=draw, args=(d,)) for d in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    every = [j for d in drawn for j in d]
    assert len(every) == 16000 and len(set(every)) == 16000


_FORK_CHECK = """
import os, sys, warnings
warnings.simplefilter("ignore")  # JAX, if loaded, warns that fork and threads do not mix
from mpl.driver.client import _JobIds
ids = _JobIds()
ids.next()  # the parent holds a batch with 255 ids left
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: its next ids, then leave at once
    os.write(write, " ".join(ids.next() for _ in range(5)).encode())
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
with os.fdopen(read) as f:
    child = set(f.read().split())
parent = {ids.next() for _ in range(5)}
sys.exit(0 if len(child) == 5 and not child & parent else 1)
"""


def test_a_forked_child_never_repeats_its_parents_ids() -> None:
    # Forked in a fresh interpreter: this test process runs JAX's threads, and a fork here
    # trips JAX's at-fork warning, which pytest turns into an error.
    done = subprocess.run([sys.executable, "-c", _FORK_CHECK], timeout=60, check=False)
    assert done.returncode == 0
