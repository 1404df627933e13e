"""Review of w33-limits (w33-rev-red): a long container anywhere in a fetched value is
encoded off the I/O thread, not only one at its top.

w33-limits answers a fetch on the worker's I/O thread only when the value is not a list,
tuple, dict or set of more than 10,000 items, judged by the value's own length: encoding a
Python list costs per item, and 5 million of them kept the I/O thread from heartbeating for
seconds (the broker took the worker for lost: ``WorkerLostError``, for every session on it).
A genuine result of a dict or tuple holding one long list (``{"xs": [...]}``) has one item
at its top: it was walked (``check_safe``) and encoded on the I/O thread all the same.
The workers here run in this process (``mp.Simulator``): the test records which thread
checks each fetched value, the step before its encoding on the same thread.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import mpl.driver as mp
import mpl.worker.jobs as worker_jobs
from mpl.wire.codec import check_safe

LONG = 20_000  # past QUICK_REPLY_ITEMS, and quick enough for a test


def flat(n: int) -> list[int]:
    return list(range(n))


def in_a_dict(n: int) -> dict[str, list[int]]:
    return {"xs": list(range(n))}


def in_a_tuple(n: int) -> tuple[Any, ...]:
    return ("label", [[i, i] for i in range(n // 2)])


@pytest.fixture
def checked_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that checked fetched values, in order."""
    names: list[str] = []
    check = check_safe

    def recording(value: Any, where: str = "") -> None:
        names.append(threading.current_thread().name)
        check(value, where)

    monkeypatch.setattr(worker_jobs, "check_safe", recording)  # as _fetch_reply calls it
    return names


@pytest.mark.parametrize("make", [in_a_dict, in_a_tuple], ids=["dict", "tuple"])
def test_a_long_container_inside_a_fetched_value_is_encoded_off_the_io_thread(
    checked_on: list[str], make: Any
) -> None:
    sim = mp.Simulator(2)
    try:
        with sim:
            long = mp.device("P0")(flat)(LONG)
            nested = mp.device("P0")(make)(LONG)
            assert len(mp.fetch(long)) == LONG
            assert len(mp.fetch(nested)) in (1, 2)
    finally:
        sim.close()
    long_on, nested_on = checked_on  # (a short value comes back inline, never fetched)
    assert long_on.startswith("mpl-job-")  # a long list at its top: a job thread, as meant
    assert nested_on.startswith("mpl-job-"), f"the nested long list was checked on {nested_on}"
