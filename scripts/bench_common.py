"""What every benchmark phase shares: the rows, recording and timing, ports, floor processes.

``record`` appends a row in the reference harness's format (phase, metric, unit, n, median,
min, max, extras) to ``ROWS`` and prints it; ``scripts/bench.py`` prints the table and writes
the JSON at the end.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from mpl.driver.launcher import LocalCluster

ROWS: list[dict[str, Any]] = []


def summarize(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def record(phase: str, metric: str, xs: list[float], unit: str = "s", **extra: Any) -> None:
    row = {"phase": phase, "metric": metric, "unit": unit, **summarize(xs), **extra}
    ROWS.append(row)
    tail = "".join(f"{k} {fmt(row[k], unit)}, " for k in ("p90", "p99") if k in row)
    print(
        f"[{phase}] {metric}: {fmt(row['median'], unit)} (min {fmt(row['min'], unit)}, "
        f"{tail}max {fmt(row['max'], unit)}, n={row['n']})",
        flush=True,
    )


# Callable[..., Any], not [[], Any]: callers bind loop variables as lambda defaults
# (`lambda job=job: ...`), which mypy cannot infer against a no-argument callable
def measure(fn: Callable[..., Any], reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        if value < 1e-3:
            return f"{value * 1e6:.1f} µs"
        if value < 1:
            return f"{value * 1e3:.3f} ms"
        return f"{value:.3f} s"
    if unit in ("MB/s", "jobs/s"):
        return f"{value:.0f} {unit}"
    return f"{value:.4g} {unit}"


HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1024 * 1024


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A ``bench_floor.py`` role as its own process (``env``: extra environment)."""
    script = os.path.join(HERE, "bench_floor.py")
    return subprocess.Popen([sys.executable, script, *args], env={**os.environ, **(env or {})})


class Percentiles(TypedDict):
    """Extra columns of a row (its keys are known, so ``**`` cannot fill ``unit``)."""

    p50: float
    p90: float
    p99: float


def percentiles(xs: list[float]) -> Percentiles:
    ys = sorted(xs)

    def at(q: float) -> float:
        return ys[min(len(ys) - 1, int(len(ys) * q))]

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def start_cluster(world: int, protocol: str = "SEMI2K", field: str = "FM128") -> LocalCluster:
    import mpl.driver as mp

    cluster: LocalCluster = mp.local_cluster(
        mp.ClusterSpec.simple(world, spu_protocol=protocol, spu_field=field), timeout=60.0
    )
    return cluster
