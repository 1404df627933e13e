"""Operating the daemons: Prometheus metrics on --metrics-port, JSON logs, refusal logging."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import boom, one, wait_until
from prometheus_client.parser import text_string_to_metric_families

from mpl.driver.launcher import daemon_command
from mpl.wire import GraphBuilder, RemoteError

pytestmark = pytest.mark.daemons

METRICS = ("--metrics-port", "0", "--log-format", "json")


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``base``/metrics, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def job(fn: Any, *args: Any) -> Any:
    b = GraphBuilder(2)
    v = b.op("pcall", [], ranks=(0,), fn=b.fn(fn), args=args)[0]
    return b.build([v])


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines of a daemon's log (the banner it echoes is plain text)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
    return [json.loads(ln) for ln in lines]  # each must parse on its own


def test_metrics_count_jobs_outcomes_and_errors(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", broker_args=METRICS, worker_args=METRICS)
    broker_url = cluster.impl.metrics_url("broker")
    worker_url = cluster.impl.metrics_url("worker0")
    before = scrape(broker_url)
    assert before[("mpl_workers_up", ())] == 2
    client = cluster.client()
    sid = client.open_session().session
    for _ in range(3):
        client.submit(sid, job(one), {}, timeout=10)
    with pytest.raises(RemoteError):
        client.submit(sid, job(boom, 7), {}, timeout=10)
    ctx = zmq.Context()
    try:  # one undecodable message to the broker
        junk = ctx.socket(zmq.DEALER)
        junk.setsockopt(zmq.LINGER, 0)
        junk.connect(cluster.address)
        junk.send_multipart([b"not mpl", b"\xff"])
        assert junk.poll(5000)
        junk.close()
    finally:
        ctx.term()
    after = scrape(broker_url)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert moved("mpl_jobs_total", outcome="ok") == 3
    assert moved("mpl_jobs_total", outcome="failed") == 1
    assert moved("mpl_job_seconds_count") == 4
    assert moved("mpl_job_seconds_bucket", le="+Inf") == 4
    assert moved("mpl_protocol_errors_total") == 1
    assert moved("mpl_bytes_total", direction="routed") > 0
    assert after[("mpl_jobs_in_flight", ())] == 0
    assert after[("mpl_sessions", ())] == 1
    assert after[("mpl_workers_up", ())] == 2
    # the worker's own port: its job counts, and its memory (read from /proc)
    wait_until(
        lambda: scrape(worker_url)[("mpl_jobs_total", (("outcome", "ok"), ("rank", "0")))] == 3,
        what="rank 0's metrics to count its jobs",
    )
    mine = scrape(worker_url)
    assert mine[("mpl_jobs_total", (("outcome", "failed"), ("rank", "0")))] == 1
    assert mine[("mpl_worker_rss_bytes", (("rank", "0"),))] > 1 << 20
    assert ("mpl_spu_lanes", (("rank", "0"),)) in mine
    assert mine[("mpl_worker_objects", (("rank", "0"),))] >= 3  # the outputs of the 3 jobs
    # the broker's view of each rank, from heartbeats
    wait_until(
        lambda: scrape(broker_url).get(("mpl_worker_rss_bytes", (("rank", "1"),)), 0) > 1 << 20,
        what="rank 1's memory to reach the broker's metrics",
    )


def test_json_logs_carry_rank_job_and_session(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", broker_args=METRICS, worker_args=METRICS)
    client = cluster.client()
    sid = client.open_session().session
    with pytest.raises(RemoteError) as failed:
        client.submit(sid, job(boom, 3), {}, timeout=10)
    job_id = failed.value.job
    run = cluster.impl.run_dir

    def worker_line() -> dict[str, Any] | None:
        return next((ln for ln in json_lines(run / "worker0.log") if ln.get("job") == job_id), None)

    line = wait_until(worker_line, what="rank 0 to log the failed job")
    assert line["role"] == "worker" and line["rank"] == 0 and line["session"] == sid
    assert line["level"] == "info" and "boom" in line["error"]
    assert {"time", "message"} <= set(line)
    broker_line = wait_until(
        lambda: next(
            (ln for ln in json_lines(run / "broker.log") if ln.get("job") == job_id), None
        ),
        what="the broker to log the failed job",
    )
    assert broker_line["role"] == "broker" and broker_line["session"] == sid
    # every line of both logs is JSON (and the worker's all carry its rank)
    assert all(ln["rank"] == 0 for ln in json_lines(run / "worker0.log"))
    text = [ln for ln in (run / "broker.log").read_text().splitlines() if ln.strip()]
    assert text and all(ln.startswith("{") for ln in text)


def test_refusals_are_logged_once_per_peer(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", broker_args=("--log-format", "json"))
    ctx = zmq.Context()
    try:
        socks = []
        for _ in range(2):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(cluster.address)
            socks.append(s)
        for s in socks:
            for _ in range(20):
                s.send_multipart([b"not mpl", b"\xff"])
            for _ in range(20):
                assert s.poll(5000), "every bad message is still answered with a refusal"
                s.recv_multipart()
        for s in socks:
            s.close()
    finally:
        ctx.term()
    status = cluster.client().status()
    assert status["protocol_errors"] == 40  # all counted ...
    refusals = [ln for ln in json_lines(cluster.impl.run_dir / "broker.log") if ln.get("peer")]
    assert len(refusals) == 2  # ... but each peer is logged once
    assert len({ln["peer"] for ln in refusals}) == 2
    assert all("bad message" in ln["error"] for ln in refusals)


def test_grafana_dashboard_uses_only_metrics_the_daemons_export() -> None:
    import re

    from mpl.broker.metrics import broker_families
    from mpl.worker.metrics import worker_families

    status = {
        "ranks": [{"rank": 0, "state": "up", "objects": 1, "rss_bytes": 1, "spu_lanes": 0}],
        "sessions": [],
        "jobs_in_flight": 0,
        "world_size": 1,
    }
    ledger = {
        "outcomes": {"ok": 0},
        "buckets": [(0.1, 0)],
        "seconds_sum": 0.0,
        "seconds_count": 0,
        "jobs_per_second": 0.0,
    }
    exported: set[str] = set()
    families = [*broker_families({"status": status, "ledger": ledger}), *worker_families({}, 0)]
    for family in families:
        exported |= {s.name for s in family.samples} | {family.name}
    dashboard = json.loads(
        (Path(__file__).parent.parent / "deploy" / "grafana-mpl.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bmpl_[a-z_]+", e)}
    assert used and used <= exported, used - exported
    required = {
        "mpl_jobs_total", "mpl_job_seconds_bucket", "mpl_jobs_in_flight", "mpl_workers_up",
        "mpl_sessions", "mpl_bytes_total", "mpl_protocol_errors_total", "mpl_worker_objects",
        "mpl_worker_rss_bytes", "mpl_spu_lanes",
    }  # fmt: skip
    assert required <= exported


def test_refusal_log_is_bounded_per_peer_and_per_second() -> None:
    import logging

    from mpl.wire.logs import RefusalLog

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.refusals")
    logger.propagate = False
    logger.addHandler(Keep())
    now = [0.0]
    refusals = RefusalLog(logger, quiet_s=60.0, burst=3, clock=lambda: now[0])
    for _ in range(5):
        refusals.refused("a", "bad")
    assert lines == ["refused a: bad"]  # repeats of one peer within a minute: counted only
    for peer in "bcdef":
        refusals.refused(peer, "bad")
    assert len(lines) == 3 and refusals.suppressed == 4 + 3  # at most 3 lines a second
    now[0] = 61.0
    refusals.refused("a", "bad again")
    assert lines[-1] == "refused a: bad again (4 more refusals from it were not logged)"


def test_ledger_outcomes_are_a_fixed_set_whatever_error_kind_arrives() -> None:
    from mpl.broker.ledger import OUTCOMES, JobLedger
    from mpl.wire.jobs import Exec, JobResult
    from mpl.wire.remote import ErrorInfo
    from mpl.wire.run_stats import pack_stats

    clock = [0.0]
    ledger = JobLedger(clock=lambda: clock[0])
    for i, kind in enumerate(["WorkerLostError", "Weird<kind>", "x" * 500, ""]):
        ledger.received(Exec("s", f"j{i}", "d", (0, 1), {}))
        clock[0] += 0.2
        span = ledger.sent(JobResult(f"j{i}", error=ErrorInfo(kind, "m")))
        assert span is not None and span.outcome in OUTCOMES
    ledger.received(Exec("s", "ok", "d", (0,), {}))
    clock[0] += 0.003
    ledger.sent(JobResult("ok", stats={0: pack_stats(0.002, 5.0, [])}))
    assert set(ledger.outcomes) == set(OUTCOMES)
    assert ledger.outcomes["worker_lost"] == 1 and ledger.outcomes["failed"] == 3
    assert ledger.outcomes["ok"] == 1 and ledger.count == 5
    assert ledger.recent[-1].ranks == {0: (5.0, 0.002)}  # the worker's own timing
    assert sum(ledger.bucket_counts) == 5 and ledger.bucket_counts[2] == 1  # 3 ms: in (2.5, 5] ms


def test_the_ledger_forgets_the_oldest_start_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Execs whose jobs never end (refused, or a driver that floods) keep at most
    _STARTED_LIMIT starts: the oldest is forgotten, later ones still end with a span."""
    from mpl.broker import ledger as ledger_mod
    from mpl.wire.jobs import Exec, JobResult

    monkeypatch.setattr(ledger_mod, "_STARTED_LIMIT", 3)
    ledger = ledger_mod.JobLedger(clock=lambda: 1.0)
    for i in range(5):
        ledger.received(Exec("s", f"j{i}", "d", (0,), {}))
        ledger.received(Exec("s", f"j{i}", "d", (0,), {}))  # a repeat is no new start
    assert len(ledger._started) == 3
    assert ledger.sent(JobResult("j1")) is None  # forgotten
    span = ledger.sent(JobResult("j4"))
    assert span is not None and span.outcome == "ok" and span.session == "s"
    assert ledger.outcomes["ok"] == 2 and ledger.count == 1


def test_a_duplicate_rank_refusal_is_logged_with_its_peer(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", broker_args=("--log-format", "json"))
    cmd = [*daemon_command("mpl-worker"), "--broker", cluster.address, "--rank", "1"]
    for _ in range(2):  # the same refusal twice: two peers (a socket each), two lines
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=20, cwd=cluster.impl.run_dir
        )
        assert proc.returncode == 3
    lines = [
        ln
        for ln in json_lines(cluster.impl.run_dir / "broker.log")
        if "already served" in ln.get("error", "")
    ]
    assert len(lines) == 2 and len({ln["peer"] for ln in lines}) == 2
    assert all(ln["level"] == "warning" and ln["role"] == "broker" for ln in lines)
