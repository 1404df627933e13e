"""In-process clusters: the real broker and worker code on threads, over inproc:// sockets.

This is what ``mp.Simulator`` runs on. It is not a fake: the same ``Broker`` and ``Worker``
classes as the daemons, the same codec and messages; only the transport is in-memory.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from mpl.broker.daemon import Broker
from mpl.wire.cluster import ClusterSpec
from mpl.wire.control import HEARTBEAT_S
from mpl.wire.errors import MplTimeoutError
from mpl.worker.daemon import Worker

__all__ = ["InProcessCluster"]


class InProcessCluster:
    """A broker and one worker per rank, each on its own thread, sharing one ZeroMQ context."""

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        data_root: Path | None = None,
        job_timeout_s: float = 600.0,
        ready_timeout: float = 10.0,
        extensions: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.ctx: zmq.Context[Any] = zmq.Context()
        name = secrets.token_hex(4)
        self._tmp = None
        if data_root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mpl-sim-")
            data_root = Path(self._tmp.name)
        self.data_root = data_root
        self.broker = Broker(
            cluster, f"inproc://mpl-{name}-broker", context=self.ctx, heartbeat_s=heartbeat_s
        ).start()
        self.address = self.broker.address
        self.workers = [
            Worker(
                self.address,
                rank,
                context=self.ctx,
                data_bind=f"inproc://mpl-{name}-data-{rank}",
                data_root=data_root / f"rank{rank}",
                heartbeat_s=heartbeat_s,
                job_timeout_s=job_timeout_s,
                extensions=(extensions or {}).get(rank),
            ).start()
            for rank in range(cluster.world_size)
        ]
        deadline = time.monotonic() + ready_timeout
        for w in self.workers:
            if not w.joined.wait(max(0.0, deadline - time.monotonic())):
                self.close()
                raise MplTimeoutError(
                    f"in-process worker {w.rank} did not join within {ready_timeout:g} s"
                )

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(5)
        self.broker.stop()
        self.broker.join(5)
        self.ctx.term()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> InProcessCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
