"""The status report: its shape (a plain dict the broker builds) and its table form.

``mpl-broker status URL`` and ``ctx.status()`` print the same table.
"""

from __future__ import annotations

from typing import Any

from mpl.wire.printable import one_line

__all__ = ["format_status"]


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    # every cell is someone's word (a worker's host, a driver's session name, the broker's
    # own fields): shown on one line, its control characters escaped (wire/printable.py)
    rows = [[one_line(c) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def format_status(status: dict[str, Any]) -> str:
    """Render a status dict as a readable multi-table text."""
    lines = [
        f"broker {one_line(status.get('broker_id', '?'))}  up {status.get('uptime_s', 0):.0f} s  "
        f"world size {one_line(status.get('world_size', '?'))}  "
        f"jobs in flight {status.get('jobs_in_flight', 0)}  "
        f"done {status.get('jobs_done', 0)}  failed {status.get('jobs_failed', 0)}  "
        f"routed {_bytes(status.get('bytes_routed', 0))}",
        "",
    ]
    ranks = [
        [
            str(r["rank"]),
            r["state"],
            str(r.get("pid", "")),
            str(r.get("host", "")),
            f"{r['heartbeat_age_s']:.1f} s" if r.get("heartbeat_age_s") is not None else "-",
            str(r.get("objects", "-")),
            str(r.get("jobs_running", "-")),
            _bytes(r.get("bytes_in", 0)),
            _bytes(r.get("bytes_out", 0)),
        ]
        for r in status.get("ranks", [])
    ]
    lines += _table(
        ["rank", "state", "pid", "host", "heartbeat", "objects", "jobs", "moved in", "moved out"],
        ranks,
    )
    sessions = [
        [
            s["session"],
            s.get("name", ""),
            str(s.get("drivers", 0)),
            f"{s.get('idle_s', 0):.1f} s",
            f"{s.get('lease_s', 0):.0f} s",
            str(s.get("symbols", 0)),
            str(s.get("jobs", 0)),
        ]
        for s in status.get("sessions", [])
    ]
    lines += [
        "",
        *_table(["session", "name", "drivers", "idle", "lease", "symbols", "jobs"], sessions),
    ]
    running = status.get("progress") or {}
    if running:
        lines += ["", "this driver's jobs in progress:"]
        for job, p in running.items():
            where = (
                f"rank {p['rank']} at op {p['done']}/{p['total']} ({p['op']})"
                if p.get("rank") is not None
                else "no report yet"
            )
            elapsed = p.get("elapsed_s", 0)
            lines.append(f"  {one_line(job)}: {elapsed:.1f} s, slowest {one_line(where)}")
    errors = status.get("errors", [])
    lines += ["", f"recent errors ({len(errors)}):" if errors else "recent errors: none"]
    lines += [f"  {one_line(e, 1024)}" for e in errors]
    return "\n".join(lines)
