"""The worker's metrics port: its own counters in Prometheus text format on ``/metrics``.

A scrape asks the worker's I/O loop for a copy of its counters (the same ones its
heartbeats carry to the broker); nothing here reads the worker's tables itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mpl.wire.snapshot import SnapshotSlot

if TYPE_CHECKING:
    from mpl.wire.httpd import MetricsServer
    from mpl.worker.daemon import Worker

__all__ = ["WorkerCollector", "rss_bytes", "serve_metrics", "worker_families"]

_WAIT_S = 2.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def worker_families(stats: dict[str, Any], rank: int) -> Iterator[Any]:
    """Metric families from one copy of a worker's counters."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    jobs = CounterMetricFamily(
        "mpl_jobs", "Jobs this worker ran, by outcome.", labels=["rank", "outcome"]
    )
    jobs.add_metric([str(rank), "ok"], stats.get("jobs_done", 0))
    jobs.add_metric([str(rank), "failed"], stats.get("jobs_failed", 0))
    yield jobs
    moved = CounterMetricFamily(
        "mpl_bytes", "Peer bytes moved by this worker.", labels=["rank", "direction"]
    )
    moved.add_metric([str(rank), "in"], stats.get("bytes_in", 0))
    moved.add_metric([str(rank), "out"], stats.get("bytes_out", 0))
    yield moved
    errors = CounterMetricFamily(
        "mpl_protocol_errors", "Messages this worker dropped as malformed.", labels=["rank"]
    )
    errors.add_metric([str(rank)], stats.get("protocol_errors", 0))
    yield errors
    gauges = {
        "mpl_jobs_in_flight": ("jobs_running", "Jobs running on this worker now."),
        "mpl_sessions": ("sessions", "Sessions holding values on this worker."),
        "mpl_worker_objects": ("objects", "Values this worker holds."),
        "mpl_worker_rss_bytes": ("rss_bytes", "This worker's resident memory."),
        "mpl_spu_lanes": ("spu_lanes", "SPU runtimes this worker created."),
        "mpl_moves_pending": ("moves_pending", "Peer moves received but not yet taken."),
    }
    for name, (key, doc) in gauges.items():
        family = GaugeMetricFamily(name, doc, labels=["rank"])
        family.add_metric([str(rank)], stats.get(key, 0))
        yield family


class WorkerCollector:
    def __init__(self, slot: SnapshotSlot, rank: int) -> None:
        self.slot = slot
        self.rank = rank

    def collect(self) -> Iterator[Any]:
        snap = self.slot.get(_WAIT_S)
        if snap is not None:
            yield from worker_families(snap, self.rank)


def serve_metrics(worker: Worker, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Start serving ``worker``'s metrics on ``host:port`` (a thread)."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    from mpl.wire.httpd import MetricsServer

    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker.snapshots, worker.rank))
    ProcessCollector(registry=registry)
    return MetricsServer(
        registry,
        host=host,
        port=port,
        status=lambda: worker.snapshots.get(_WAIT_S),
        name=f"mpl-worker-{worker.rank}-metrics",
    )
