"""A cluster of real daemons on this machine: one ``mpl-broker`` and one ``mpl-worker`` per
rank, as separate processes on free loopback ports, stopped by pid.

``mp.local_cluster`` wraps this; tests use it directly to kill and restart processes.
With ``secure=True`` it makes a key pair for the broker, every node and one driver
(``local``) in ``<run_dir>/keys``, pins them in the spec it writes, and starts every daemon
in secure mode (CurveZMQ with ZAP), as a real deployment would run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpl.driver.client import Client
from mpl.driver.context import Context
from mpl.wire.cluster import ClusterSpec
from mpl.wire.curve import Curve
from mpl.wire.errors import MplError, MplTimeoutError
from mpl.wire.keys import load_keypair, write_keypair
from mpl.wire.lifetime import PARENT_ENV

__all__ = ["LocalCluster", "ProcessCluster", "daemon_command", "local_cluster"]

_LISTENING = re.compile(r"mpl-broker listening on (\S+)")
LOCAL_DRIVER = "local"  # the driver key a secure local cluster makes for its own context
_METRICS = re.compile(r"metrics on (http://\S+)/metrics")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def daemon_command(name: str) -> list[str]:
    """How to start ``mpl-broker`` / ``mpl-worker`` with this interpreter's installation."""
    script = Path(sys.executable).with_name(name)
    if script.exists():
        return [str(script)]
    module = {"mpl-broker": "mpl.broker.cli", "mpl-worker": "mpl.worker.cli"}[name]
    return [sys.executable, "-c", f"from {module} import main; main()"]


class ProcessCluster:
    """Start a broker and ``cluster.world_size`` workers; :meth:`close` stops them all.

    Logs and the cluster file go to ``run_dir`` (a temporary directory unless given).
    ``run_under`` is a command each daemon runs under, its command line appended (a
    profiler: ``("valgrind", "--tool=callgrind")``); its process is the daemon's pid.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        run_dir: Path | None = None,
        heartbeat_s: float = 1.0,
        job_timeout_s: float = 600.0,
        ready_timeout: float = 30.0,
        env: dict[str, str] | None = None,
        secure: bool = False,
        broker_args: Sequence[str] = (),
        worker_args: Sequence[str] | Mapping[int, Sequence[str]] = (),
        run_under: Sequence[str] = (),
    ) -> None:
        self.broker_args = tuple(broker_args)  # extra options, e.g. ("--metrics-port", "0")
        # a command every daemon runs under (a profiler, say: scripts/profile_jobs.py)
        self.run_under = tuple(run_under)
        # extra mpl-worker options: the same for every rank, or per rank
        self.worker_args = worker_args
        self._tmp = None
        if run_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="mpl-cluster-")
            run_dir = Path(self._tmp)
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.keys_dir = run_dir / "keys"
        self.curve: Curve | None = None  # the driver's side, in secure mode
        if secure:
            cluster = self._make_keys(cluster)
        self.cluster = cluster
        self.heartbeat_s = heartbeat_s
        self.job_timeout_s = job_timeout_s
        self.env = {
            **os.environ,
            "JAX_ENABLE_X64": "1",
            PARENT_ENV: str(os.getpid()),
            **(env or {}),
        }
        self.cluster_file = run_dir / "cluster.json"  # JSON: the broker then skips importing yaml
        self.cluster_file.write_text(json.dumps(cluster.to_dict()))
        self.broker: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.address = ""
        try:
            self._start_all(ready_timeout)
        except BaseException:
            self.close()
            raise

    def _make_keys(self, cluster: ClusterSpec) -> ClusterSpec:
        """Key pairs for the broker, every node and the local driver; the spec pinning them."""
        made = {}
        for name in ["broker", *(n.name for n in cluster.nodes), LOCAL_DRIVER]:
            made[name] = write_keypair(self.keys_dir, name, overwrite=True)[2]
        spec = cluster.with_keys(
            made["broker"],
            [made[n.name] for n in cluster.nodes],
            {LOCAL_DRIVER: made[LOCAL_DRIVER]},
        )
        self.curve = Curve(load_keypair(self.key_file(LOCAL_DRIVER)), spec)
        return spec

    def key_file(self, name: str) -> Path:
        """The secret key file of ``name`` (``broker``, a node name, ``local``)."""
        return self.keys_dir / f"{name}.key_secret"

    # -- processes ------------------------------------------------------------------------
    def _start_all(self, ready_timeout: float) -> None:
        """Start the broker and the workers at once: workers keep saying hello until the
        broker listens. The port is picked here, so a rare clash just means another try."""
        for attempt in range(3):
            self.address = f"tcp://127.0.0.1:{_free_port()}"
            self.start_broker(listen=self.address, wait=False)
            for rank in range(self.cluster.world_size):
                self.start_worker(rank)
            try:
                self.wait_ready(ready_timeout)
                return
            except MplError:
                assert self.broker is not None
                if self.broker.poll() is None or attempt == 2:
                    raise
                for proc in self.workers.values():  # the port was taken: start over
                    proc.kill()
                    proc.wait(5)

    def start_broker(
        self, *, listen: str | None = None, ready_timeout: float = 30.0, wait: bool = True
    ) -> str:
        """Start the broker (on its previous address when restarting); returns its URL.

        With ``wait`` it returns once the broker prints the address it listens on.
        """
        out = self.run_dir / "broker.out"
        out.write_text("")
        cmd = [
            *self.run_under,
            *daemon_command("mpl-broker"),
            "--listen",
            listen or self.address or "tcp://127.0.0.1:0",
            "--cluster",
            str(self.cluster_file),
            "--heartbeat",
            str(self.heartbeat_s),
            "-v",
            *self.broker_args,
        ]
        if self.curve is not None:
            cmd += ["--key", str(self.key_file("broker"))]
        with open(out, "ab") as stdout, open(self.run_dir / "broker.log", "ab") as log:
            self.broker = subprocess.Popen(cmd, stdout=stdout, stderr=log, env=self.env)
        if not wait:
            return self.address
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            match = _LISTENING.search(out.read_text())
            if match:
                self.address = match.group(1)
                return self.address
            if self.broker.poll() is not None:
                raise MplError(
                    f"mpl-broker exited with {self.broker.returncode}: {self._tail('broker.log')}"
                )
            time.sleep(0.01)
        raise MplTimeoutError(f"mpl-broker did not start within {ready_timeout:g} s")

    def _worker_args(self, rank: int) -> tuple[str, ...]:
        extra = self.worker_args
        return tuple(extra.get(rank, ())) if isinstance(extra, Mapping) else tuple(extra)

    def start_worker(self, rank: int) -> subprocess.Popen[bytes]:
        cmd = [
            *self.run_under,
            *daemon_command("mpl-worker"),
            "--broker",
            self.address,
            "--rank",
            str(rank),
            "--data-root",
            str(self.run_dir / f"rank{rank}"),
            "--heartbeat",
            str(self.heartbeat_s),
            "--job-timeout",
            str(self.job_timeout_s),
            "-v",
            *(["--trusted"] if self.cluster.trusted else []),
            *self._worker_args(rank),
        ]
        if self.curve is not None:
            name = self.cluster.nodes[rank].name
            cmd += ["--key", str(self.key_file(name)), "--cluster", str(self.cluster_file)]
        with open(self.run_dir / f"worker{rank}.log", "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.run_dir,
            )
        self.workers[rank] = proc
        return proc

    def wait_ready(self, timeout: float = 30.0, ranks: list[int] | None = None) -> dict[str, Any]:
        """Ask the broker's status until every rank (or those given) is up."""
        from mpl.broker.query import StatusProbe

        want = set(range(self.cluster.world_size) if ranks is None else ranks)
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        with StatusProbe(self.address, curve=self.curve) as probe:
            while time.monotonic() < deadline:
                try:
                    last = probe.ask(max(0.05, min(1.0, deadline - time.monotonic())))
                except MplTimeoutError:
                    last = {}
                up = {r["rank"] for r in last.get("ranks", []) if r["state"] == "up"}
                if want <= up:
                    return last
                for rank, proc in self.workers.items():
                    if rank in want and proc.poll() is not None:
                        raise MplError(
                            f"mpl-worker rank {rank} exited with {proc.returncode}: "
                            f"{self._tail(f'worker{rank}.log')}"
                        )
                if self.broker is not None and self.broker.poll() is not None:
                    raise MplError(
                        f"mpl-broker exited with {self.broker.returncode}: "
                        f"{self._tail('broker.log')}"
                    )
                time.sleep(0.01)
        raise MplTimeoutError(f"ranks {sorted(want)} were not all up within {timeout:g} s: {last}")

    def metrics_url(self, name: str = "broker", timeout: float = 10.0) -> str:
        """The base URL (``http://host:port``) a daemon printed for its metrics port;
        ``name`` is ``broker`` or ``worker<R>``."""
        path = self.run_dir / ("broker.out" if name == "broker" else f"{name}.log")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = _METRICS.search(path.read_text() if path.exists() else "")
            if match:
                return match.group(1)
            time.sleep(0.02)
        raise MplTimeoutError(f"{name} printed no metrics address within {timeout:g} s")

    def kill_worker(self, rank: int, sig: int = signal.SIGKILL) -> None:
        proc = self.workers[rank]
        proc.send_signal(sig)
        proc.wait(10)

    def kill_broker(self, sig: int = signal.SIGKILL) -> None:
        assert self.broker is not None
        self.broker.send_signal(sig)
        self.broker.wait(10)

    def pids(self) -> list[int]:
        procs = [self.broker, *self.workers.values()]
        return [p.pid for p in procs if p is not None]

    def close(self) -> None:
        """SIGTERM everything, then SIGKILL what is still running after 5 s."""
        procs = [p for p in [*self.workers.values(), self.broker] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _tail(self, name: str) -> str:
        try:
            return (self.run_dir / name).read_text()[-2000:]
        except OSError:
            return ""

    def __enter__(self) -> ProcessCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalCluster(Context):
    """A context on daemons it started itself; leaving its ``with`` block stops them."""

    def __init__(self, cluster: ClusterSpec, *, timeout: float = 30.0, **options: Any) -> None:
        self.processes = ProcessCluster(cluster, **options)
        try:
            client = Client(
                self.processes.address,
                timeout=timeout,
                trusted=cluster.trusted,
                curve=self.processes.curve,
                # the driver judges the broker's silence by its own interval: the daemons'
                heartbeat_s=self.processes.heartbeat_s,
            )
            super().__init__(client)
        except BaseException:
            self.processes.close()
            raise
        self._creator = threading.get_ident()
        self._depth = 0

    def __enter__(self) -> LocalCluster:
        super().__enter__()
        if threading.get_ident() == self._creator:
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if threading.get_ident() == self._creator:
            self._depth -= 1
            if self._depth == 0:
                self.close()

    def _shutdown(self) -> None:
        try:
            super()._shutdown()
        finally:
            self.processes.close()


def local_cluster(
    cluster: ClusterSpec | int = 2, *, trusted: bool | None = None, **options: Any
) -> LocalCluster:
    """Spawn ``mpl-broker`` and one ``mpl-worker`` per rank on free loopback ports.

    Use it as ``with mp.local_cluster(2) as ctx:``: the processes stop when the block ends,
    also when it raises (and if this process dies, the kernel stops them too). Options:
    ``timeout`` (control requests), ``heartbeat_s``, ``job_timeout_s``, ``run_dir`` (logs),
    ``secure=True`` (keys made in a temporary folder, every socket on CurveZMQ).
    ``trusted=True`` (or ``trusted: true`` in the spec) lets pickles cross between parties.
    """
    spec = ClusterSpec.simple(cluster) if isinstance(cluster, int) else cluster
    if trusted is not None and trusted != spec.trusted:
        spec = dataclasses.replace(spec, trusted=trusted)
    return LocalCluster(spec, **options)
