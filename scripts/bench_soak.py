"""The soak phase of ``scripts/bench.py``: does anything grow, and what does a big move cost?

1. 10,000 small jobs, each with a peer move (a value made on P0, moved to P1 and used
   there), on real daemons. The broker's and each worker's RSS, the objects the workers'
   stores hold, and the broker's sessions and calls are read before (after a warm-up) and
   after: none may grow.
2. One 1 GiB float64 array made on P0 and moved to P1: the peak RSS (VmHWM) each end
   reaches above its RSS before, as a multiple of the payload (the promise: at most 3x).

Run it with ``scripts/bench.py --phases soak``; ``record(phase, metric, values, unit=...)``
is bench.py's.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

JOBS = 10_000
WARMUP = 500
GIB = 1 << 30


def proc_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmRSS``, ``VmHWM``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def snapshot(cluster: Any, ctx: Any) -> dict[str, float]:
    """RSS (MiB) of every daemon and the counts of what their tables hold."""
    gc.collect()  # the driver frees Values it no longer references, in batches
    ctx.flush()
    status = _settled_status(ctx)
    out: dict[str, float] = {"broker_rss": proc_kib(cluster.broker.pid, "VmRSS") / 1024}
    for rank, proc in cluster.workers.items():
        out[f"worker{rank}_rss"] = proc_kib(proc.pid, "VmRSS") / 1024
    for row in status["ranks"]:
        out[f"worker{row['rank']}_objects"] = row.get("objects", 0)
    out["broker_sessions"] = len(status.get("sessions", []))
    out["broker_jobs_in_flight"] = status.get("jobs_in_flight", 0)
    return out


def _settled_status(ctx: Any, timeout: float = 10.0) -> Any:
    """The status once the workers' object counts stop changing (deletes are batched)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        status = ctx.status()
        counts = [row.get("objects", 0) for row in status["ranks"]]
        if counts == last or time.monotonic() > deadline:
            return status
        last = counts
        time.sleep(0.3)  # the workers report on their next heartbeat


def phase_soak(record: Callable[..., None]) -> None:
    import numpy as np

    import mpl.driver as mp
    from mpl.driver.launcher import ProcessCluster
    from mpl.wire import ClusterSpec

    cluster = ProcessCluster(ClusterSpec.simple(2, enable_spu=False), heartbeat_s=0.2)
    try:
        with mp.connect(cluster.address) as ctx:
            x = mp.put("P0", np.arange(16.0))

            @mp.function
            def step(v: Any) -> Any:  # a value made on P0, moved to P1, used there
                return mp.device("P1")(lambda a: float(a.sum()))(mp.device("P0")(np.negative)(v))

            for _ in range(WARMUP):
                step(x)
            mp.fetch(step(x))
            before = snapshot(cluster, ctx)
            t0 = time.perf_counter()
            for i in range(JOBS):
                y = step(x)
                if i % 1000 == 999:
                    assert mp.fetch(y) == -120.0
            elapsed = time.perf_counter() - t0
            after = snapshot(cluster, ctx)
            record("soak", f"{JOBS} jobs with a move, per job", [elapsed / JOBS])
            for key in before:
                unit = "MiB" if key.endswith("_rss") else "n"
                record(
                    "soak",
                    f"{key} before / after {JOBS} jobs",
                    [before[key], after[key]],
                    unit=unit,
                    before=before[key],
                    after=after[key],
                    growth=after[key] - before[key],
                )
            _big_move(cluster, ctx, record)
            ctx.close()
    finally:
        cluster.close()


def _big_move(cluster: Any, ctx: Any, record: Callable[..., None]) -> None:
    import numpy as np

    import mpl.driver as mp

    sender, receiver = cluster.workers[0].pid, cluster.workers[1].pid
    base = {pid: proc_kib(pid, "VmRSS") * 1024 for pid in (sender, receiver)}
    big = mp.device("P0")(lambda: np.ones(GIB // 8))()
    moved = mp.put("P1", big)
    assert mp.fetch(mp.device("P1")(lambda a: int(a.nbytes))(moved)) == GIB
    for name, pid in (("sender P0", sender), ("receiver P1", receiver)):
        peak = proc_kib(pid, "VmHWM") * 1024 - base[pid]
        record(
            "soak", f"1 GiB move: {name} peak RSS above its start / payload", [peak / GIB], unit="x"
        )
    del big, moved
    gc.collect()
    ctx.flush()
