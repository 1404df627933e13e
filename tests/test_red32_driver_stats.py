"""Third red team w32, finding R32-4: a broker's answers can pin a gigabyte in a driver.

A job's answer carries each rank's run stats as an opaque blob (``mpl.wire.run_stats``),
not sealed in secure mode: the broker copies the workers' blobs into the ``JobResult``. An
honest broker refuses a blob over ``MAX_STATS_BYTES`` (256 KiB) from a worker; the driver
takes whatever the answer holds, for any ranks, and keeps it with the job's record for
``mp.trace`` (the last 64 jobs of each context). A hostile broker filling each answer's
stats to the 16 MiB header bound so pins about 1 GiB in every context of the driver.

Strict xfail: the check belongs in the driver's receive path (``wire/result_read.py``,
where each rank's blob is already looked at: ``len(blob) > MAX_STATS_BYTES`` refused, and
ranks outside the job's), which this red team does not touch.
"""

from __future__ import annotations

import pytest
from test_red32_driver_text import FakeBroker

from mpl.driver.client import Client
from mpl.wire.graph import Graph
from mpl.wire.jobs import Exec, JobResult
from mpl.wire.record import Record
from mpl.wire.run_stats import MAX_STATS_BYTES


@pytest.mark.xfail(strict=True, reason="R32-4: a JobResult's stats are kept at any size")
def test_a_brokers_stats_are_not_kept_past_their_bound() -> None:
    blob = b"\x94" + b"x" * (2 << 20)  # 2 MiB a rank, for ranks the job does not have

    def answer(msg: Record) -> list[Record]:
        if not isinstance(msg, Exec):
            return []
        return [JobResult(msg.job, {}, None, False, {r: blob for r in range(7)}, {})]

    broker = FakeBroker(answer)
    client = Client(f"tcp://127.0.0.1:{broker.port}", timeout=10.0)
    try:
        result = client.submit("s", Graph(1, (), (), ()), {})
    finally:
        client.close()
        broker.close()
    kept = sum(len(b) for b in result.stats.values())
    assert kept <= MAX_STATS_BYTES, f"{kept} bytes of stats kept for a 1-rank job"
