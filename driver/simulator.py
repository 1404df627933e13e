"""``mp.Simulator``: the real broker and worker code on threads, over inproc:// sockets.

It is not a fake: the same ``Broker`` and ``Worker`` classes as the daemons, the same codec
and messages; only the transport is in-memory (and SPU links are in-memory too).
"""

from __future__ import annotations

import dataclasses
import inspect
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from mpl.broker.daemon import Broker
from mpl.driver.client import INPROC_CONTEXTS, Client
from mpl.driver.context import Context
from mpl.wire.cluster import ClusterSpec
from mpl.wire.control import HEARTBEAT_S
from mpl.wire.errors import MplTimeoutError
from mpl.worker.daemon import Worker

__all__ = ["InProcessCluster", "Simulator"]

# Every keyword ClusterSpec.simple takes (mplang's included) goes to the spec.
_SIMPLE_KEYWORDS = frozenset(
    name
    for name, p in inspect.signature(ClusterSpec.simple).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)


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
        worker_options: dict[int, dict[str, Any]] | None = None,
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
        INPROC_CONTEXTS[self.address] = self.ctx
        self.workers = [
            Worker(
                self.address,
                rank,
                context=self.ctx,
                data_bind=f"inproc://mpl-{name}-data-{rank}",
                spu_bind=f"inproc://mpl-{name}-spu-{rank}",
                data_root=data_root / f"rank{rank}",
                heartbeat_s=heartbeat_s,
                job_timeout_s=job_timeout_s,
                extensions=(extensions or {}).get(rank),
                trusted=cluster.trusted,
                **(worker_options or {}).get(rank, {}),  # e.g. code="kernels", kernels=[...]
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
        INPROC_CONTEXTS.pop(self.address, None)
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


class Simulator(Context):
    """A whole cluster inside this process: ``mp.Simulator(cluster)`` or ``.simple(n)``
    (``mp.Simulator(n)`` is ``.simple(n)``).

    ``with sim:`` makes it current; ``sim.close()`` stops its threads. Like a deployment it
    is not trusted by default: values crossing between parties must be in the safe value
    format. ``trusted=True`` (or ``trusted: true`` in the spec) lets pickles cross.
    """

    def __init__(
        self,
        cluster: ClusterSpec | int | None = None,
        *,
        session: str = "",
        timeout: float = 30.0,
        trusted: bool | None = None,
        **options: Any,
    ) -> None:
        if isinstance(cluster, int):  # mplang v1's mp.Simulator(world_size)
            cluster = ClusterSpec.simple(cluster)
        spec = cluster or ClusterSpec.simple(2)
        if trusted is not None and trusted != spec.trusted:
            spec = dataclasses.replace(spec, trusted=trusted)
        self.runtime = InProcessCluster(spec, **options)
        client = Client(
            self.runtime.address, context=self.runtime.ctx, timeout=timeout, trusted=spec.trusted
        )
        try:
            super().__init__(client, session=session)
        except BaseException:
            client.close()
            self.runtime.close()
            raise

    @classmethod
    def simple(cls, world_size: int, **options: Any) -> Simulator:
        """A simulator of ``ClusterSpec.simple(world_size)``; options go to ``ClusterSpec.simple``
        (``spu_protocol``, ``spu_field``, ``op_bindings``, ``trusted``...) or to the simulator
        (``timeout``, ``session``)."""
        spec_keys = _SIMPLE_KEYWORDS - {"trusted"}
        trusted = bool(options.pop("trusted", False))
        spec = ClusterSpec.simple(
            world_size,
            trusted=trusted,
            **{k: options.pop(k) for k in list(options) if k in spec_keys},
        )
        return cls(spec, **options)

    def _shutdown(self) -> None:
        super()._shutdown()
        self.runtime.close()
