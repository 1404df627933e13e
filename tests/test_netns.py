"""Across hosts: broker, two workers and the driver, each in a network namespace of its own
with its own address, joined by a bridge; secure mode with fixed worker ports.

Needs root and ``ip netns`` (CI has both); skipped with the reason otherwise. Addresses come
from a private range used only inside the namespaces made here; the namespaces and the
bridge are deleted in teardown, also when the test fails. Nothing is routed outside them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from deployment import Deployment

pytestmark = [pytest.mark.daemons, pytest.mark.spu]

_TAG = f"{os.getpid() % 100000}"
_SUBNET = f"10.213.{os.getpid() % 250}"
ROLES = ("broker", "w0", "w1", "drv")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class Hosts:
    """One namespace per role, each on a veth into one bridge, address ``_SUBNET.<i+1>``."""

    def __init__(self) -> None:
        self.bridge = f"i8b{_TAG}"
        self.ns = {role: f"i8n{_TAG}{role}" for role in ROLES}
        self.addr = {role: f"{_SUBNET}.{i + 1}" for i, role in enumerate(ROLES)}
        self.made_ns: list[str] = []
        self.made_bridge = False

    def up(self) -> None:
        self._must("link", "add", self.bridge, "type", "bridge")
        self.made_bridge = True
        self._must("link", "set", self.bridge, "up")
        for i, role in enumerate(ROLES):
            ns, outer, inner = self.ns[role], f"i8v{_TAG}{i}", f"i8p{_TAG}{i}"
            self._must("netns", "add", ns)
            self.made_ns.append(ns)
            self._must("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._must("link", "set", inner, "netns", ns)
            self._must("link", "set", outer, "master", self.bridge)
            self._must("link", "set", outer, "up")
            self._must("-n", ns, "addr", "add", f"{self.addr[role]}/24", "dev", inner)
            self._must("-n", ns, "link", "set", inner, "up")
            self._must("-n", ns, "link", "set", "lo", "up")

    def run_in(self, role: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[role]]

    def down(self) -> None:
        for ns in self.made_ns:  # deleting a namespace deletes its end of the veth pair
            _ip("netns", "del", ns)
        if self.made_bridge:
            _ip("link", "del", self.bridge)

    @staticmethod
    def _must(*args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if _ip("netns", "list").returncode != 0:
        pytest.skip("`ip netns` is not available")
    made = Hosts()
    try:
        try:
            made.up()
            probe = subprocess.run([*made.run_in("drv"), "true"], capture_output=True, timeout=30)
            if probe.returncode != 0:
                raise RuntimeError(f"ip netns exec: {probe.stderr.decode(errors='replace')}")
        except (RuntimeError, OSError) as exc:
            pytest.skip(f"cannot use network namespaces here: {exc}")
        yield made
    finally:
        made.down()


DRIVER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import mpl.driver as mp

    url, key, cluster = sys.argv[1:4]
    with mp.connect(url, key=key, cluster=cluster, timeout=20) as ctx:
        deadline = time.monotonic() + 30
        while not all(r["state"] == "up" for r in ctx.status()["ranks"]):
            assert time.monotonic() < deadline, ctx.status()
            time.sleep(0.05)
        x = mp.device("P0")(lambda: np.arange(5.0))()
        moved = mp.device("P1")(lambda v: float(v.sum()))(x)
        secret = mp.device("SP0")(lambda a, b: a < b)(x, moved)
        print("RESULT", mp.fetch(moved), mp.fetch(mp.put("P1", secret)).tolist(), flush=True)
        ctx.close()
    """
)


def test_secure_cluster_across_network_namespaces(hosts: Hosts, tmp_path: Path) -> None:
    d = Deployment(tmp_path)
    try:
        d.start_broker(f"tcp://{hosts.addr['broker']}:5555", prefix=hosts.run_in("broker"))
        for rank in (0, 1):
            role = f"w{rank}"
            ports = ["--host", hosts.addr[role], "--data-port", "6000", "--spu-port", "6001"]
            d.start_worker(rank, extra=ports, prefix=hosts.run_in(role))
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        args = [str(d.key("analyst")), str(d.cluster_file)]
        driver = subprocess.run(
            [*hosts.run_in("drv"), sys.executable, str(script), d.address, *args],
            capture_output=True,
            text=True,
            timeout=90,
            env=d.env,
            cwd=tmp_path,
        )
        logs = "\n".join(d.log(n) for n in ("broker", "worker0", "worker1"))
        assert driver.returncode == 0, driver.stderr[-3000:] + logs[-3000:]
        assert "RESULT 10.0 [True, True, True, True, True]" in driver.stdout
        # each worker really listened on its own address and the fixed ports
        for rank in (0, 1):
            addr = hosts.addr[f"w{rank}"]
            assert f"data tcp://{addr}:6000, spu tcp://{addr}:6001" in d.log(f"worker{rank}")
            assert "CURVE" in d.log(f"worker{rank}")
    finally:
        d.close()
