"""Chrome/Perfetto traces of recent jobs: one row per rank, one span per op.

Open the file at https://ui.perfetto.dev or chrome://tracing. Times come from each worker's
clock; on one machine (or NTP-synchronised ones) the rows line up. Each rank's stats are
read here, when the trace is written (``JobRecord.rank_stats``); a rank whose stats are
unreadable gets a "stats unreadable" mark on its row, saying why, instead of spans.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import ProtocolError

if TYPE_CHECKING:
    from mpl.driver.context import JobRecord

__all__ = ["write_trace"]

_DRIVER_PID = 1_000_000


def write_trace(jobs: Sequence[JobRecord], cluster: ClusterSpec, path: str) -> str:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _DRIVER_PID, "name": "process_name", "args": {"name": "driver"}}
    ]
    for node in cluster.nodes:
        events.append(
            {
                "ph": "M",
                "pid": node.rank,
                "name": "process_name",
                "args": {"name": f"rank {node.rank} ({node.name})"},
            }
        )
    for job in jobs:
        events.append(
            {
                "ph": "X",
                "pid": _DRIVER_PID,
                "tid": 0,
                "name": job.name or job.job,
                "ts": job.started * 1e6,
                "dur": job.seconds * 1e6,
                "args": {"job": job.job},
            }
        )
        for rank, stats in job.rank_stats().items():
            if isinstance(stats, ProtocolError):  # say so on the rank's row, at the job's start
                events.append(
                    {
                        "ph": "i",
                        "pid": rank,
                        "tid": 0,
                        "s": "p",
                        "name": "stats unreadable",
                        "ts": job.started * 1e6,
                        "args": {"job": job.job, "why": str(stats)},
                    }
                )
                continue
            started = stats.started
            events.append(
                {
                    "ph": "X",
                    "pid": rank,
                    "tid": 0,
                    "name": f"job {job.job}",
                    "ts": started * 1e6,
                    "dur": stats.run_s * 1e6,
                }
            )
            for index, label, start, end in stats.ops:
                events.append(
                    {
                        "ph": "X",
                        "pid": rank,
                        "tid": 1,
                        "name": label,
                        "ts": (started + start) * 1e6,
                        "dur": (end - start) * 1e6,
                        "args": {"op": index, "job": job.job},
                    }
                )
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path
