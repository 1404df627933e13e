"""The benchmark's printed tables: every row with its floor and ratio, and the targets
beside the reference runtime's figures (see scripts/bench.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench_common import ROWS, fmt


def table() -> str:
    lines = [
        "| phase | metric | median | p99 | min | max | n | floor | mpl / floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ROWS:
        u = r["unit"]
        p99 = fmt(r["p99"], u) if "p99" in r else ""
        floor = _value(r, "floor")
        if floor is None and (r["phase"], r["metric"]) in FLOORS:
            floor = _value(_find(ROWS, *FLOORS[r["phase"], r["metric"]]))
        shown = fmt(floor, u) if floor else "-"
        ratio = f"{r['median'] / floor:.2f}" if floor else "-"
        lines.append(
            f"| {r['phase']} | {r['metric']} | {fmt(r['median'], u)} | {p99} | "
            f"{fmt(r['min'], u)} | {fmt(r['max'], u)} | {r['n']} | {shown} | {ratio} |"
        )
    return "\n".join(lines)


# Rows of the older phases and the floor row (of the same run) each is compared with.
_RT = ("floor", "raw pyzmq driver->relay->worker round trip")
FLOORS: dict[tuple[str, str], tuple[str, str]] = {
    ("dist2", "trivial job (1 pcall on P0) + fetch, 2p"): _RT,
    ("dist2", "(i) trivial pcall-all+fetch, compiled, 2p"): _RT,
    ("dist3", "trivial job (1 pcall on P0) + fetch, 3p"): _RT,
    ("dist2", "(ii) P0->P1 64 MiB f64: net transfer"): ("floor", "raw pyzmq PUSH->PULL 64 MiB"),
}


def _find(rows: list[dict[str, Any]], phase: str, metric: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["phase"] == phase and r["metric"] == metric), None)


def _value(row: dict[str, Any] | None, key: str = "median") -> float | None:
    if row is None or key not in row or not isinstance(row[key], (int, float)):
        return None
    return float(row[key])


# (label, ours (phase, metric, key), reference (phase, metric, key), floor (phase, metric), target)
_M = "(iii) SPU SEMI2K 2p millionaire (reveal to P0)"
_MM = "(iii) SPU SEMI2K 2p 100x100 f64 matmul + reveal"
_A = "(iii) SPU ABY3 3p millionaire (reveal to P0)"
_AM = "(iii) SPU ABY3 3p 100x100 f64 matmul + reveal"
COMPARE: list[
    tuple[
        str,
        tuple[str, str, str],
        tuple[str, str, str],
        tuple[str, str] | None,
        Callable[[float, float | None], bool],
        str,
    ]
] = [
    (
        "trivial job + fetch, 2p, p50",
        ("dist2", "(i) trivial pcall-all+fetch, compiled, 2p", "median"),
        ("http2", "(i) trivial pcall-all+fetch, compiled, 2p", "median"),
        ("floor", "raw pyzmq driver->relay->worker round trip"),
        lambda v, f: v <= 0.5e-3,
        "<= 0.5 ms",
    ),
    (
        "trivial job + fetch, 2p, p99",
        ("dist2", "(i) trivial pcall-all+fetch, compiled, 2p", "p99"),
        ("http2", "", ""),
        None,
        lambda v, f: v <= 1e-3,
        "<= 1 ms",
    ),
    (
        "trivial job + fetch, 3p, p50",
        ("dist3", "(i) trivial pcall-all+fetch, compiled, 3p", "median"),
        ("http3", "(i) trivial pcall-all+fetch, compiled, 3p", "median"),
        None,
        lambda v, f: v <= 0.7e-3,
        "<= 0.7 ms",
    ),
    (
        "P0->P1 64 MiB move (MB/s)",
        ("dist2", "(ii) P0->P1 64 MiB f64: net transfer", "median"),
        ("http2", "(ii) P0->P1 64 MiB f64: net transfer", "MBps_net"),
        ("floor", "raw pyzmq PUSH->PULL 64 MiB"),
        lambda v, f: f is not None and v >= 0.8 * f,
        ">= 80% of raw PUSH/PULL",
    ),
    (
        "SPU SEMI2K/FM128 2p millionaire + reveal",
        ("spu2", _M, "median"),
        ("http2-brpc", _M, "median"),
        ("floor", "raw libspu SEMI2K 2p millionaire + reveal"),
        lambda v, f: f is not None and v <= f + 1e-3,
        "<= floor + 1 ms",
    ),
    (
        "SPU SEMI2K/FM128 2p 100x100 matmul + reveal",
        ("spu2", _MM, "median"),
        ("http2-brpc", _MM, "median"),
        ("floor", "raw libspu SEMI2K 2p 100x100 f64 matmul + reveal"),
        lambda v, f: f is not None and v <= 1.1 * f,
        "<= 1.1 x floor",
    ),
    (
        "SPU ABY3/FM64 3p millionaire + reveal",
        ("spu3", _A, "median"),
        ("http3-brpc", _A, "median"),
        ("floor", "raw libspu ABY3 3p millionaire + reveal"),
        lambda v, f: f is not None and v <= f + 1e-3,
        "<= floor + 1 ms",
    ),
    (
        "SPU ABY3/FM64 3p 100x100 matmul + reveal",
        ("spu3", _AM, "median"),
        ("http3-brpc", _AM, "median"),
        ("floor", "raw libspu ABY3 3p 100x100 f64 matmul + reveal"),
        lambda v, f: f is not None and v <= 1.1 * f,
        "<= 1.1 x floor",
    ),
    (
        "import (fresh process)",
        ("import", "(c) fresh `python -c 'import mpl.driver'` wall", "median"),
        ("import", "(c) fresh `python -c 'import mplang'` wall", "median"),
        None,
        lambda v, f: v <= 0.3,
        "<= 0.3 s",
    ),
    (
        "worker idle RSS (MiB)",
        ("startup", "(c) worker RSS idle", "median"),
        ("http2", "(c) worker rank0 RSS idle / peak (VmHWM)", "min"),
        None,
        lambda v, f: v <= 100,
        "<= 100 MiB",
    ),
    (
        "pipelined trivial jobs/s, 64 in flight, 2p",
        ("pipeline", "trivial jobs/s, 64 in flight (mp.submit), 2p", "median"),
        ("", "", ""),
        None,
        lambda v, f: f is not None and v >= 0.5 * f,
        ">= 50% of the raw relay",
    ),
    *[
        (
            f"pcall on all {n} ranks + fetch",
            ("fanout", f"trivial pcall on all {n} ranks + fetch", "median"),
            ("", "", ""),
            None,
            lambda v, f: f is not None and v <= 1.5 * f,
            "<= 1.5 x raw fan-out",
        )
        for n in (2, 4, 8, 16, 32)
    ],
    (
        "eager move + call, per call",
        ("eager", "eager move + call (P0 -> P1), per call", "median"),
        ("", "", ""),
        None,
        lambda v, f: v <= 0.7e-3,
        "<= 0.7 ms",
    ),
    (
        "@mp.function cache-hit overhead (driver)",
        ("eager", "driver cost of an @mp.function cache hit (round trip stubbed)", "median"),
        ("", "", ""),
        None,
        lambda v, f: v <= 50e-6,
        "<= 50 us",
    ),
    (
        "start broker + 2 workers until ready",
        ("startup", "(c) start broker + 2 workers -> all ready", "median"),
        ("http2", "(c) start 2 workers -> all /health OK", "median"),
        None,
        lambda v, f: v <= 0.5,
        "<= 0.5 s",
    ),
]


def summary(reference: list[dict[str, Any]]) -> str:
    lines = ["| metric | reference | floor | mpl | target | met |", "|---|---|---|---|---|---|"]
    for label, ours, ref, floor, ok, target in COMPARE:
        mine = _value(_find(ROWS, ours[0], ours[1]), ours[2])
        if mine is None:
            continue
        theirs = _value(_find(reference, ref[0], ref[1]), ref[2]) if ref[1] else None
        # rows measured against their own floor carry it; others name a floor row
        base = _value(_find(ROWS, *floor)) if floor else _value(_find(ROWS, *ours[:2]), "floor")
        unit = (
            "MB/s"
            if "MB/s" in label
            else "MiB"
            if "MiB)" in label
            else "jobs/s"
            if "jobs/s" in label
            else "s"
        )
        show = lambda v, unit=unit: fmt(v, unit) if v is not None else "-"  # noqa: E731
        lines.append(
            f"| {label} | {show(theirs)} | {show(base)} | {show(mine)} | {target} | "
            f"{'yes' if ok(mine, base) else 'NO'} |"
        )
    return "\n".join(lines)
