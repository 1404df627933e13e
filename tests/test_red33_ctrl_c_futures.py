"""Red team w33 (R33-3): Ctrl-C while waiting on a job's future cancels the job too.

Last round's Ctrl-C cancel (README: "Ctrl-C in a driver waiting for a job raises
``KeyboardInterrupt`` there and cancels the job") covered the synchronous call only. A
driver waiting on ``mp.submit(...).result()``, in ``mp.wait`` or in ``mp.as_completed``
got its ``KeyboardInterrupt``, but the job ran on for as long as it took (here a minute),
holding its ranks (a rank waiting for another's data waited with it) and counted in
flight, though no one would read its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers import nap_then, wait_until
from interrupts import interrupt_once_running, jobs_in_flight

import mpl.driver as mp
from mpl.broker.query import query_status

pytestmark = pytest.mark.daemons


@mp.function  # one job: rank 1 waits for rank 0's value, a minute in the making
def _slow() -> Any:
    return mp.device("P1")(int)(mp.device("P0")(nap_then)(1, 60.0))


def _waits() -> dict[str, Callable[[Any], Any]]:
    return {
        "result": lambda future: future.result(),
        "wait": lambda future: mp.wait([future]),
        "as_completed": lambda future: list(mp.as_completed([future])),
    }


@pytest.mark.parametrize("how", sorted(_waits()))
def test_ctrl_c_while_waiting_on_a_future_cancels_its_job(
    make_cluster: Callable[..., Any], how: str
) -> None:
    cluster = make_cluster("tcp")

    ctx = mp.connect(cluster.address)
    try:
        with ctx:
            future = mp.submit(_slow)
            interrupter = interrupt_once_running(cluster.address)
            with pytest.raises(KeyboardInterrupt):
                _waits()[how](future)
            interrupter.join(30)
            wait_until(
                lambda: jobs_in_flight(cluster.address) == 0, 10, "the broker to drop the job"
            )
            assert query_status(cluster.address, timeout=5)["jobs_failed"] == 1  # cancelled
            with pytest.raises(mp.MplError):  # its future says so, promptly
                future.result(timeout=30)
            assert mp.fetch(mp.device("P1")(int)(2)) == 2  # the session goes on
    finally:
        ctx.close()
