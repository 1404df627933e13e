"""The broker's metrics port: Prometheus metrics on ``/metrics``, the status page on ``/``.

Every scrape asks the broker's loop for a snapshot (status + job ledger) and turns it into
metric families; nothing here reads the broker's tables directly. prometheus_client is
imported only when a metrics port is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mpl.wire.snapshot import SnapshotSlot

if TYPE_CHECKING:
    from mpl.broker.daemon import Broker
    from mpl.wire.httpd import MetricsServer

__all__ = ["BrokerCollector", "broker_families", "serve_metrics"]

_WAIT_S = 2.0  # a scrape gives up on a broker loop that does not answer within this


def broker_families(snap: dict[str, Any]) -> Iterator[Any]:
    """Metric families from one broker snapshot (``{"status": ..., "ledger": ...}``)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    status, ledger = snap["status"], snap["ledger"]
    jobs = CounterMetricFamily(
        "mpl_jobs", "Jobs answered by the broker, by outcome.", labels=["outcome"]
    )
    for outcome, n in ledger["outcomes"].items():
        jobs.add_metric([outcome], n)
    yield jobs
    cumulative, buckets = 0, []
    for bound, n in ledger["buckets"]:
        cumulative += n
        buckets.append((repr(float(bound)), cumulative))
    buckets.append(("+Inf", ledger["seconds_count"]))
    yield HistogramMetricFamily(
        "mpl_job_seconds",
        "Job duration seen by the broker, from Exec to its answer.",
        buckets=buckets,
        sum_value=ledger["seconds_sum"],
    )
    yield GaugeMetricFamily("mpl_jobs_in_flight", "Jobs running now.", status["jobs_in_flight"])
    ranks = status["ranks"]
    up = sum(1 for r in ranks if r["state"] == "up")
    yield GaugeMetricFamily("mpl_workers_up", "Ranks with a live worker.", up)
    yield GaugeMetricFamily("mpl_world_size", "Ranks in the cluster.", status["world_size"])
    yield GaugeMetricFamily("mpl_sessions", "Open sessions.", len(status["sessions"]))
    moved = CounterMetricFamily("mpl_bytes", "Bytes through the broker.", labels=["direction"])
    moved.add_metric(["routed"], status.get("bytes_routed", 0))
    yield moved
    yield CounterMetricFamily(
        "mpl_protocol_errors",
        "Messages refused as malformed.",
        status.get("protocol_errors", 0),
    )
    yield GaugeMetricFamily(
        "mpl_jobs_per_second", "Jobs answered per second (last 10 s).", ledger["jobs_per_second"]
    )
    per_rank = {
        "mpl_worker_objects": ("objects", "Values held by each rank's worker (heartbeat)."),
        "mpl_worker_rss_bytes": ("rss_bytes", "Resident memory of each rank's worker."),
        "mpl_spu_lanes": ("spu_lanes", "SPU runtimes created by each rank's worker."),
        "mpl_heartbeat_age_seconds": ("heartbeat_age_s", "Seconds since a rank was last heard."),
    }
    for name, (key, doc) in per_rank.items():
        family = GaugeMetricFamily(name, doc, labels=["rank"])
        for r in ranks:
            if r["state"] == "up" and isinstance(r.get(key), (int, float)):
                family.add_metric([str(r["rank"])], r[key])
        yield family


class BrokerCollector:
    """A prometheus_client collector over a broker's snapshots."""

    def __init__(self, slot: SnapshotSlot) -> None:
        self.slot = slot

    def collect(self) -> Iterator[Any]:
        snap = self.slot.get(_WAIT_S)
        if snap is not None:
            yield from broker_families(snap)


def serve_metrics(broker: Broker, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Start serving ``broker``'s metrics and page on ``host:port`` (a thread)."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    from mpl.broker.page import render_page
    from mpl.broker.status_view import anonymous, anonymous_ledger
    from mpl.wire.httpd import MetricsServer

    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker.snapshots))
    ProcessCollector(registry=registry)

    secure = broker.state.secure  # fixed at start: read once, not from the loop's tables

    def shown() -> dict[str, Any] | None:
        """The snapshot as an unauthenticated HTTP client may see it: in secure mode the
        sessions are drivers' business (only counted), as in ``mpl-broker status``, and
        so is which session and job each recent job of the ledger was."""
        snap = broker.snapshots.get(_WAIT_S)
        if snap is None or not secure:
            return snap
        return {
            **snap,
            "status": anonymous(snap["status"]),
            "ledger": anonymous_ledger(snap["ledger"]),
        }

    def page() -> str | None:
        snap = shown()
        return None if snap is None else render_page(snap)

    return MetricsServer(
        registry,
        host=host,
        port=port,
        page=page,
        status=shown,
        name="mpl-broker-metrics",
    )
