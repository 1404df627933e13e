"""The benchmark's printed tables: every row with its floor and ratio, and the targets
beside the reference runtime's figures (see scripts/bench.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench_common import ROWS, fmt


def table() -> str:
    lines = [
        "| phase | metric | median | p90 | p99 | min | max | n | floor | mpl / floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ROWS:
        u = r["unit"]
        p90, p99 = (fmt(r[k], u) if k in r else "" for k in ("p90", "p99"))
        floor = _value(r, "floor")
        if floor is None and (r["phase"], r["metric"]) in FLOORS:
            floor = _value(_find(ROWS, *FLOORS[r["phase"], r["metric"]]))
        shown = fmt(floor, u) if floor else "-"
        ratio = f"{r['median'] / floor:.2f}" if floor else "-"
        lines.append(
            f"| {r['phase']} | {r['metric']} | {fmt(r['median'], u)} | {p90} | {p99} | "
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


# One row of the summary: its label, our row (phase, metric, key), the reference harness's
# row (phase, metric, key; an empty metric when it has none), the floor row (phase, metric)
# when it is not the row's own "floor", whether a value (and floor) meets the target, and the
# target as printed.
_Compare = tuple[
    str,
    tuple[str, str, str],
    tuple[str, str, str],
    tuple[str, str] | None,
    Callable[[float, float | None], bool],
    str,
]
_NO_REFERENCE = ("", "", "")


def _at_most(
    label: str, ours: tuple[str, str, str], ref: tuple[str, str, str], limit: float, target: str
) -> _Compare:
    """A row met when our value is at most ``limit`` (no floor to compare with)."""
    return (label, ours, ref, None, lambda v, f: v <= limit, target)


def _spu_rows(protocol: str, field: str, n: int) -> list[_Compare]:
    """The millionaire and the matmul rows of one SPU protocol on ``n`` parties, each beside
    the reference's brpc run and raw libspu's time for the same program."""
    rows: list[_Compare] = []
    for label, metric, floor, ok, target in (
        (
            "millionaire + reveal",
            "millionaire (reveal to P0)",
            "millionaire + reveal",
            lambda v, f: f is not None and v <= f + 1e-3,
            "<= floor + 1 ms",
        ),
        (
            "100x100 matmul + reveal",
            "100x100 f64 matmul + reveal",
            "100x100 f64 matmul + reveal",
            lambda v, f: f is not None and v <= 1.1 * f,
            "<= 1.1 x floor",
        ),
    ):
        ours = f"(iii) SPU {protocol} {n}p {metric}"
        rows.append(
            (
                f"SPU {protocol}/{field} {n}p {label}",
                (f"spu{n}", ours, "median"),
                (f"http{n}-brpc", ours, "median"),
                ("floor", f"raw libspu {protocol} {n}p {floor}"),
                ok,
                target,
            )
        )
    return rows


COMPARE: list[_Compare] = [
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
        ("floor", "raw pyzmq driver->relay->worker round trip"),
        lambda v, f: v <= 1e-3,
        "<= 1 ms",
    ),
    _at_most(
        "trivial job + fetch, 3p, p50",
        ("dist3", "(i) trivial pcall-all+fetch, compiled, 3p", "median"),
        ("http3", "(i) trivial pcall-all+fetch, compiled, 3p", "median"),
        0.7e-3,
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
    *_spu_rows("SEMI2K", "FM128", 2),
    *_spu_rows("ABY3", "FM64", 3),
    _at_most(
        "import (fresh process)",
        ("import", "(c) fresh `python -c 'import mpl.driver'` wall", "median"),
        ("import", "(c) fresh `python -c 'import mplang'` wall", "median"),
        0.3,
        "<= 0.3 s",
    ),
    _at_most(
        "worker idle RSS (MiB)",
        ("startup", "(c) worker RSS idle", "median"),
        ("http2", "(c) worker rank0 RSS idle / peak (VmHWM)", "min"),
        100,
        "<= 100 MiB",
    ),
    (
        "pipelined trivial jobs/s, 64 in flight, 2p",
        ("pipeline", "trivial jobs/s, 64 in flight (mp.submit), 2p", "median"),
        _NO_REFERENCE,
        None,
        lambda v, f: f is not None and v >= 0.5 * f,
        ">= 50% of the raw relay",
    ),
    *[
        (
            f"pcall on all {n} ranks + fetch",
            ("fanout", f"trivial pcall on all {n} ranks + fetch", "median"),
            _NO_REFERENCE,
            None,
            lambda v, f: f is not None and v <= 1.5 * f,
            "<= 1.5 x raw fan-out",
        )
        for n in (2, 4, 8, 16, 32)
    ],
    *[
        (
            f"secure {what} over plaintext (x)",
            ("secure", f"{kind}: secure / plaintext p50, per turn", "median"),
            _NO_REFERENCE,
            None,
            lambda v, f: v <= 1.2,
            "<= 1.2 x (+20 %)",
        )
        for what, kind in (
            ("trivial 2p job", "trivial pcall on both ranks + fetch, compiled, 2p"),
            ("trivial P0 job", "trivial job (pcall on P0) + fetch, 2p"),
        )
    ],
    _at_most(
        "eager move + call, per call",
        ("eager", "eager move + call (P0 -> P1), per call", "median"),
        _NO_REFERENCE,
        0.7e-3,
        "<= 0.7 ms",
    ),
    _at_most(
        "@mp.function cache-hit overhead (driver)",
        ("eager", "driver cost of an @mp.function cache hit (round trip stubbed)", "median"),
        _NO_REFERENCE,
        50e-6,
        "<= 50 us",
    ),
    _at_most(
        "start broker + 2 workers until ready",
        ("startup", "(c) start broker + 2 workers -> all ready", "median"),
        ("http2", "(c) start 2 workers -> all /health OK", "median"),
        0.5,
        "<= 0.5 s",
    ),
]


def _unit(label: str) -> str:
    """The unit a summary row's label names (seconds unless it says otherwise)."""
    for marker, unit in (("MB/s", "MB/s"), ("MiB)", "MiB"), ("jobs/s", "jobs/s"), ("(x)", "x")):
        if marker in label:
            return unit
    return "s"


def summary(reference: list[dict[str, Any]]) -> str:
    lines = ["| metric | reference | floor | mpl | target | met |", "|---|---|---|---|---|---|"]
    for label, ours, ref, floor, ok, target in COMPARE:
        mine = _value(_find(ROWS, ours[0], ours[1]), ours[2])
        if mine is None:
            continue
        theirs = _value(_find(reference, ref[0], ref[1]), ref[2]) if ref[1] else None
        # rows measured against their own floor carry it; others name a floor row, read at
        # the row's own statistic (a p99 beside the floor's p99)
        if floor:
            base = _value(_find(ROWS, *floor), ours[2])
        else:
            base = _value(_find(ROWS, *ours[:2]), "floor")
        unit = _unit(label)

        def show(v: float | None, unit: str = unit) -> str:
            return fmt(v, unit) if v is not None else "-"

        lines.append(
            f"| {label} | {show(theirs)} | {show(base)} | {show(mine)} | {target} | "
            f"{'yes' if ok(mine, base) else 'NO'} |"
        )
    return "\n".join(lines)
