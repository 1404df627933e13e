"""A secure deployment as an operator would make it: keys from the ``mpl-keys`` command, a
cluster.yaml pinning them, and daemons started from their command lines.

Every process started here is stopped by its pid in :meth:`Deployment.close`. ``prefix``
runs a command somewhere else (``ip netns exec NS``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mpl.driver.launcher import daemon_command
from mpl.wire import ClusterSpec
from mpl.wire.lifetime import PARENT_ENV

_LISTENING = re.compile(r"mpl-broker listening on (\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def mpl_keys(*args: str) -> str:
    """Run the ``mpl-keys`` console script; its stdout."""
    script = Path(sys.executable).with_name("mpl-keys")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "mpl.wire.keytool"]
    return subprocess.run(
        [*cmd, *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()


class Deployment:
    """Keys for ``broker``, ``node0..``, each of ``drivers`` and each of ``outsiders`` (made
    but not pinned), and ``cluster.yaml`` under ``root``."""

    def __init__(
        self,
        root: Path,
        world: int = 2,
        drivers: Sequence[str] = ("analyst",),
        outsiders: Sequence[str] = ("intruder",),
    ) -> None:
        self.root = root
        self.keys = root / "keys"
        names = ["broker", *(f"node{r}" for r in range(world)), *drivers, *outsiders]
        self.public = {n: mpl_keys("new", n, "--dir", str(self.keys)) for n in names}
        self.spec = ClusterSpec.simple(world).with_keys(
            self.public["broker"],
            [self.public[f"node{r}"] for r in range(world)],
            {d: self.public[d] for d in drivers},
        )
        self.cluster_file = root / "cluster.yaml"
        self.cluster_file.write_text(self.spec.to_yaml())
        self.procs: list[subprocess.Popen[bytes]] = []
        self.address = ""
        self.env = {**os.environ, "JAX_ENABLE_X64": "1", PARENT_ENV: str(os.getpid())}

    def key(self, name: str) -> Path:
        return self.keys / f"{name}.key_secret"

    def add_module(self, name: str, source: str) -> None:
        """A module ``name`` with ``source``, importable by the daemons started after this
        (say, a party's kernels for ``mpl-worker --kernels name``)."""
        pkg = self.root / "pkg"
        pkg.mkdir(exist_ok=True)
        (pkg / f"{name}.py").write_text(source)
        self.env["PYTHONPATH"] = str(pkg)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(
        self, name: str, cmd: list[str], prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                [*prefix, *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.root,
            )
        self.procs.append(proc)
        return proc

    def start_broker(
        self,
        listen: str = "tcp://127.0.0.1:0",
        prefix: Sequence[str] = (),
        timeout: float = 20,
        cluster: Path | None = None,  # the broker's own copy, when it differs from the parties'
    ) -> str:
        cmd = [*daemon_command("mpl-broker"), "--listen", listen]
        cmd += ["--cluster", str(cluster or self.cluster_file), "--key", str(self.key("broker"))]
        proc = self.start("broker", cmd, prefix)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = _LISTENING.search(self.log("broker"))
            if found:
                self.address = found.group(1)
                return self.address
            if proc.poll() is not None:
                raise AssertionError(f"mpl-broker exited: {self.log('broker')}")
            time.sleep(0.01)
        raise AssertionError(f"mpl-broker did not start: {self.log('broker')}")

    def start_worker(
        self,
        rank: int,
        *,
        key: str | None = None,
        extra: Sequence[str] = (),
        prefix: Sequence[str] = (),
        name: str = "",
        cluster: Path | None = None,  # the node's own copy, when it differs from the others'
    ) -> subprocess.Popen[bytes]:
        cmd = [*daemon_command("mpl-worker"), "--broker", self.address, "--rank", str(rank)]
        cmd += ["--key", str(self.key(key or f"node{rank}"))]
        cmd += ["--cluster", str(cluster or self.cluster_file)]
        cmd += ["--data-root", str(self.root / f"data{rank}"), *extra]
        return self.start(name or f"worker{rank}", cmd, prefix)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
