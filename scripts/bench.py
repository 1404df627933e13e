#!/usr/bin/env python
"""mpl benchmarks: prints a table and writes JSON with the reference harness's row format.

    .venv/bin/python scripts/bench.py                    # every phase
    .venv/bin/python scripts/bench.py --phases codec     # a subset
    .venv/bin/python scripts/bench.py --json out.json

Rows look like the reference harness's (``../shared/bench/anchor_mplang``): phase, metric,
unit, n, median, min, max, plus extras, and metric names match where the same thing is
measured, so both JSON files line up. Phases:

  codec   encode+decode of a 64 MiB float64 array and of a small header-only message
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROWS: list[dict[str, Any]] = []


def summarize(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def record(phase: str, metric: str, xs: list[float], unit: str = "s", **extra: Any) -> None:
    row = {"phase": phase, "metric": metric, "unit": unit, **summarize(xs), **extra}
    ROWS.append(row)
    print(
        f"[{phase}] {metric}: {fmt(row['median'], unit)} (min {fmt(row['min'], unit)}, "
        f"max {fmt(row['max'], unit)}, n={row['n']})",
        flush=True,
    )


def measure(fn: Callable[[], Any], reps: int, warmup: int = 3) -> list[float]:
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
    if unit == "MB/s":
        return f"{value:.0f} MB/s"
    return f"{value:.4g} {unit}"


# -- phases --------------------------------------------------------------------------------


def phase_codec() -> None:
    import numpy as np

    from mpl.wire import decode, encode
    from mpl.wire.control import Heartbeat
    from mpl.wire.jobs import Lit

    big = Lit(np.ones(8 * 1024 * 1024, dtype=np.float64))  # 64 MiB
    record("codec", "encode+decode 64 MiB float64 array", measure(lambda: decode(encode(big)), 50))
    small = Heartbeat({"objects": 3, "bytes_in": 1024})
    record(
        "codec",
        "encode+decode small header-only message",
        measure(lambda: decode(encode(small)), 20000, warmup=100),
    )


PHASES: dict[str, Callable[[], None]] = {"codec": phase_codec}


def table() -> str:
    lines = ["| phase | metric | median | min | max | n |", "|---|---|---|---|---|---|"]
    for r in ROWS:
        u = r["unit"]
        lines.append(
            f"| {r['phase']} | {r['metric']} | {fmt(r['median'], u)} | "
            f"{fmt(r['min'], u)} | {fmt(r['max'], u)} | {r['n']} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated phases")
    ap.add_argument("--json", default="", help="write the rows here as JSON")
    args = ap.parse_args()
    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PHASES]
    if unknown:
        ap.error(f"unknown phase(s) {unknown}; choose from {list(PHASES)}")
    for p in wanted:
        PHASES[p]()
    print()
    print(table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "meta": {"label": "mpl", "date": time.strftime("%Y-%m-%d %H:%M:%S")},
                    "rows": ROWS,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
