"""Job ids drawn in batches stay unguessable: distinct, full length, never shared with a fork."""

from __future__ import annotations

import os

from mpl.driver.client import _JobIds


def test_ids_are_distinct_across_batches() -> None:
    ids = _JobIds()
    drawn = [ids.next() for _ in range(1000)]  # about four batches
    assert len(set(drawn)) == 1000
    assert all(len(j) == 24 and int(j, 16) >= 0 for j in drawn)


def test_a_forked_child_never_repeats_its_parents_ids() -> None:
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
    assert len(child) == 5 and not child & parent
