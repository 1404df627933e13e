"""Red team w31, finding R5: a worker's heartbeat counters were kept and shown unbounded,
and could rewrite its own status row.

Every heartbeat of a registered worker replaced its row's counters with the message's
``stats`` map as sent: any number of entries (a 16 MiB header holds millions, several
hundred MB once built, kept until the next beat), copied into every status the broker
builds (each driver's ``status``, each scrape of the metrics page and ``/status.json``) and
sent on. Spread after the broker's own fields, they also rewrote them: a worker could show
its row as another rank's, or as up and fresh. Now the broker keeps at most
``MAX_WORKER_STATS`` counters whose names are short identifiers, none of the row's own.
Shown here with a raw socket registering as rank 0 with a real broker (plaintext,
loopback: a hostile party's worker does the same with its own key).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from helpers import wait_until
from test_batch_nesting import _answer, broker_process, raw_dealers  # noqa: F401  (a fixture)

from mpl.wire.codec import encode, to_wire
from mpl.wire.control import Heartbeat, Welcome, WorkerHello
from mpl.wire.sessions import Reply, StatusRequest

_FLOOD = 20_000  # counters in one heartbeat (a header may hold millions)


@pytest.mark.timeout(120)
def test_a_workers_heartbeat_cannot_flood_or_rewrite_its_status_row(
    broker_process: tuple[str, int],  # noqa: F811
) -> None:
    address, _ = broker_process
    with raw_dealers(address, 2) as [worker, driver]:
        hello = WorkerHello(0, "inc-red", os.getpid(), "host", "tcp://127.0.0.1:9", "")
        worker.send_multipart(to_wire(encode(hello)))
        assert isinstance(_answer(worker, Welcome), Welcome)
        # a counter of its own, its row's fields (as ints: rank 1, fresh), then a flood
        stats = {"objects": 7, "rank": 1, "heartbeat_age_s": 0}
        stats.update({f"c{i}": i for i in range(_FLOOD)})
        worker.send_multipart(to_wire(encode(Heartbeat(stats=stats, rank=0))))
        asked = [0]

        def row() -> dict[str, Any] | None:
            asked[0] += 1
            driver.send_multipart(to_wire(encode(StatusRequest(asked[0]))))
            reply = _answer(driver, Reply)
            for one in reply.value["ranks"]:
                if one.get("objects") == 7 or (one["rank"] == 1 and "objects" in one):
                    return dict(one)
            return None

        shown = wait_until(row, 30, "the heartbeat's counters in the status")
        assert shown["rank"] == 0 and shown["heartbeat_age_s"] != 0, shown  # its own row
        assert len(shown) < 200, f"the row shows {len(shown)} entries"
