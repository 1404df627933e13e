"""The broker's status page: one self-contained HTML document (no script, no external
asset, so it works offline) that reloads itself every few seconds.

It shows the ranks with their state and heartbeat age, the sessions, jobs per second and
outcomes, recent errors, and the last jobs per rank as an SVG timeline. Every text that
came from the network (hosts, session names, error messages) is escaped.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

__all__ = ["REFRESH_S", "render_page", "timeline_svg"]

REFRESH_S = 2
_TIMELINE_JOBS = 40
_ROW_H, _LEFT, _WIDTH = 26, 70, 900
_COLOURS = {"ok": "#3b8b4f", "failed": "#c0392b", "worker_lost": "#8e44ad", "aborted": "#d68910"}

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.05em;margin:1.2em 0 .4em}
table{border-collapse:collapse;font-size:.9em}td,th{padding:.2em .7em;text-align:left;
border-bottom:1px solid #ddd}th{background:#eee}.up{color:#1e7b34}.lost{color:#b03a2e}
.absent{color:#888}.muted{color:#777;font-size:.85em}ul{font-size:.9em;margin:.2em 0}
svg{background:#fff;border:1px solid #ddd}
"""


def _cell(value: Any) -> str:
    return f"<td>{escape(str(value))}</td>"


def _age(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "-"


def _ranks_table(ranks: list[dict[str, Any]]) -> str:
    rows = []
    for r in ranks:
        state = str(r.get("state", "?"))
        rows.append(
            f'<tr class="rank" id="rank-{int(r["rank"])}" data-state="{escape(state)}">'
            f'{_cell(r["rank"])}<td class="{escape(state)}">{escape(state)}</td>'
            f"{_cell(r.get('pid', ''))}{_cell(r.get('host', ''))}"
            f"{_cell(_age(r.get('heartbeat_age_s')))}{_cell(r.get('objects', '-'))}"
            f"{_cell(r.get('jobs_running', '-'))}{_cell(r.get('reason', ''))}</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("rank", "state", "pid", "host", "heartbeat", "objects", "jobs", "note")
    )
    return f'<table id="ranks"><tr>{head}</tr>{"".join(rows)}</table>'


def _sessions_table(sessions: list[dict[str, Any]], others: int = 0) -> str:
    hidden = (
        f'<p class="muted" id="other-sessions">{others} session(s) of drivers, not shown '
        "(secure mode: a session is its drivers' business)</p>"
        if others
        else ""
    )
    if not sessions:
        return hidden or '<p id="sessions">no open session</p>'
    head = "".join(f"<th>{h}</th>" for h in ("session", "name", "drivers", "idle", "jobs"))
    rows = "".join(
        f'<tr class="session">{_cell(s.get("session", ""))}{_cell(s.get("name", ""))}'
        f"{_cell(s.get('drivers', 0))}{_cell(_age(s.get('idle_s')))}{_cell(s.get('jobs', 0))}</tr>"
        for s in sessions
    )
    return f'<table id="sessions"><tr>{head}</tr>{rows}</table>{hidden}'


def timeline_svg(recent: list[dict[str, Any]], world_size: int, now: float) -> str:
    """The last jobs as bars on one row per rank, from the oldest shown to ``now``."""
    jobs = recent[-_TIMELINE_JOBS:]
    height = _ROW_H * max(world_size, 1) + 24
    if not jobs:
        return (
            f'<svg id="timeline" width="{_WIDTH}" height="{height}" '
            f'xmlns="http://www.w3.org/2000/svg"><text x="10" y="20">no job yet</text></svg>'
        )
    begin = min(
        [float(j["started"]) for j in jobs]
        + [float(s[0]) for j in jobs for s in j["ranks"].values()]
    )
    span = max(now - begin, 1e-3)
    scale = (_WIDTH - _LEFT - 10) / span
    parts = [
        f'<svg id="timeline" width="{_WIDTH}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg" font-size="11">'
    ]
    for rank in range(world_size):
        y = rank * _ROW_H + 4
        parts.append(f'<text x="4" y="{y + 15}">rank {rank}</text>')
        parts.append(
            f'<line x1="{_LEFT}" x2="{_WIDTH - 10}" y1="{y + _ROW_H - 3}" '
            f'y2="{y + _ROW_H - 3}" stroke="#eee"/>'
        )
    for j in jobs:
        colour = _COLOURS.get(str(j["outcome"]), "#7f8c8d")
        for rank_text, (start, seconds) in j["ranks"].items():
            rank = int(rank_text)
            if not 0 <= rank < world_size:
                continue
            x = _LEFT + (float(start) - begin) * scale
            w = max(float(seconds) * scale, 2.0)
            job = j.get("job", "")  # (not told on a secure broker's page)
            label = escape(
                f"job {job} on rank {rank}: {float(seconds) * 1000:.1f} ms, {j['outcome']}"
            )
            parts.append(
                f'<rect class="job" data-job="{escape(str(job))}" data-rank="{rank}" '
                f'x="{x:.1f}" y="{rank * _ROW_H + 6}" width="{w:.1f}" height="{_ROW_H - 10}" '
                f'fill="{colour}"><title>{label}</title></rect>'
            )
    axis_y = world_size * _ROW_H + 18
    parts.append(f'<text x="{_LEFT}" y="{axis_y}" class="muted">-{span:.1f} s</text>')
    parts.append(f'<text x="{_WIDTH - 40}" y="{axis_y}">now</text></svg>')
    return "".join(parts)


def render_page(snap: dict[str, Any], now: float | None = None) -> str:
    """The whole page for one broker snapshot (``{"status": ..., "ledger": ...}``)."""
    status, ledger = snap["status"], snap["ledger"]
    now = time.time() if now is None else now
    ranks = status.get("ranks", [])
    up = sum(1 for r in ranks if r.get("state") == "up")
    outcomes = ", ".join(f"{escape(k)} {v}" for k, v in ledger["outcomes"].items() if v)
    errors = status.get("errors", [])
    error_list = (
        '<ul id="errors">'
        + "".join(f"<li>{escape(str(e))}</li>" for e in reversed(errors))
        + "</ul>"
        if errors
        else '<p id="errors">none</p>'
    )
    # (a secure broker's page is not told which job: status_view.anonymous_ledger)
    last = ledger["recent"][-1].get("job", "-") if ledger["recent"] else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_S}">
<title>mpl broker {escape(str(status.get("broker_id", "")))}</title>
<style>{_STYLE}</style></head><body>
<h1>mpl broker {escape(str(status.get("broker_id", "")))}</h1>
<p>up {status.get("uptime_s", 0):.0f} s &middot; workers up
<b id="workers-up">{up}</b> / {escape(str(status.get("world_size", "?")))} &middot;
jobs in flight <b>{escape(str(status.get("jobs_in_flight", 0)))}</b> &middot;
<b id="jobs-per-second">{ledger["jobs_per_second"]:.1f}</b> jobs/s &middot;
outcomes: <span id="outcomes">{outcomes or "no job yet"}</span></p>
<h2>Ranks</h2>{_ranks_table(ranks)}
<h2>Sessions ({len(status.get("sessions", [])) + int(status.get("other_sessions", 0))})</h2>
{_sessions_table(status.get("sessions", []), int(status.get("other_sessions", 0)))}
<h2>Last jobs per rank</h2>
<p class="muted">last job: <span id="last-job">{escape(str(last))}</span>;
green: ok, red: failed, purple: worker lost, orange: aborted</p>
{timeline_svg(ledger["recent"], int(status.get("world_size", 0)), now)}
<h2>Recent errors</h2>{error_list}
<p class="muted">This page reloads every {REFRESH_S} s. Metrics for Prometheus:
<a href="/metrics">/metrics</a>; raw status: <a href="/status.json">/status.json</a>.</p>
</body></html>
"""
