"""A quick program run inline in secure mode whose run stats do not fit the inline Done (a
blob of 1 KiB or more: many ops, or a long op label) still answers: its values were sealed
inline (``WorkerSeal.sealed_scalars``, which books no recipient), and the Done the job
shell then builds as a record is sealed by ``WorkerSeal.outbound`` for the recipient the
inline sealing kept. Found in review: the first form of that booking dropped the
recipient, and the job failed with AuthenticationError."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_sealed_broker import Setup

import mpl.driver as mp

pytestmark = pytest.mark.daemons


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path, True)
    try:
        yield s
    finally:
        s.close()


def _long_named() -> Callable[[], int]:
    def one() -> int:
        return 1

    one.__qualname__ = one.__name__ = "a_step_" + "x" * 1100  # its op's span > 1 KiB
    return one


def test_a_quick_program_with_a_long_stats_blob_keeps_answering_in_secure_mode(
    setup: Setup,
) -> None:
    fn = mp.device("P0")(_long_named())
    with setup.ctx:
        got = [mp.fetch(fn()) for _ in range(4)]  # the first pooled, the next inline
    assert got == [1, 1, 1, 1]
    assert setup.workers[0].jobs.stats()["jobs_inline"] >= 1
