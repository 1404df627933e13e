"""Secure mode with real daemons started from their command lines, keys made by mpl-keys.

Each test is an attack or a misconfiguration from issue 8: it fails clearly and changes
nothing, while the genuine parties keep working.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from deployment import Deployment, free_port
from helpers import wait_until

import mpl.driver as mp
from mpl.broker.query import StatusProbe
from mpl.driver.launcher import daemon_command
from mpl.wire import encode
from mpl.wire.codec import to_wire
from mpl.wire.curve import Curve
from mpl.wire.data import Move
from mpl.wire.keys import load_keypair
from mpl.wire.sessions import StatusRequest
from mpl.wire.sockets import configure
from mpl.worker.spu_link import SPU_MAGIC

pytestmark = pytest.mark.daemons


def analyst(d: Deployment) -> Curve:
    return Curve(load_keypair(d.key("analyst")), d.spec)


def rank_rows(d: Deployment, timeout: float = 2.0) -> dict[int, dict[str, Any]]:
    with StatusProbe(d.address, curve=analyst(d)) as probe:
        return {row["rank"]: row for row in probe.ask(timeout)["ranks"]}


def wait_up(d: Deployment, ranks: range, timeout: float = 20) -> dict[int, dict[str, Any]]:
    all_up: dict[int, dict[str, Any]] = wait_until(
        lambda: (rows := rank_rows(d)) and all(rows[r]["state"] == "up" for r in ranks) and rows,
        timeout,
        "every rank up",
    )
    return all_up


def up(d: Deployment, world: int = 2, extra: dict[int, list[str]] | None = None) -> None:
    d.start_broker()
    for rank in range(world):
        d.start_worker(rank, extra=(extra or {}).get(rank, ()))
    wait_up(d, range(world))


def test_allowed_driver_runs_a_move_and_an_spu_millionaire(deployment: Deployment) -> None:
    up(deployment)
    ctx = mp.connect(
        deployment.address, key=deployment.key("analyst"), cluster=deployment.cluster_file
    )
    with ctx:
        x = mp.device("P0")(lambda: np.arange(4.0))()
        total = mp.device("P1")(lambda v: float(v.sum()))(x)  # moved P0 -> P1
        assert mp.fetch(total) == 6.0
        alice = mp.device("P0")(lambda: 3_000_000)()
        bob = mp.device("P1")(lambda: 5_000_000)()
        poorer = mp.device("SP0")(lambda a, b: a < b)(alice, bob)
        assert bool(mp.fetch(mp.put("P0", poorer))) is True
    ctx.close()
    # the broker's key alone pins the broker, but a job must be sealed for each worker's
    # key, which only the spec gives: refused at the driver, saying what is missing
    pinned = mp.connect(
        deployment.address,
        key=deployment.key("analyst"),
        broker_key=deployment.public["broker"],
    )
    with pinned:
        assert pinned.client.status()["world_size"] == 2
        with pytest.raises(mp.AuthenticationError, match="cluster spec"):
            mp.device("P1")(lambda: "hi")()
    pinned.close()
    # the status command speaks CURVE too, as a listed driver
    out = subprocess.run(
        [
            *daemon_command("mpl-broker"),
            "status",
            deployment.address,
            "--key",
            str(deployment.key("analyst")),
            "--cluster",
            str(deployment.cluster_file),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and "up" in out.stdout, out.stderr


def test_unknown_driver_key_is_refused_at_once_and_logged(deployment: Deployment) -> None:
    up(deployment)
    started = time.monotonic()
    with pytest.raises(mp.AuthenticationError, match="refused this driver's key"):
        mp.connect(
            deployment.address,
            key=deployment.key("intruder"),
            cluster=deployment.cluster_file,
            timeout=30,
        )
    assert time.monotonic() - started < 5
    # a driver pinning a key the server does not hold (not our broker) also learns at once
    started = time.monotonic()
    with pytest.raises(mp.AuthenticationError, match="no secure handshake"):
        mp.connect(
            deployment.address,
            key=deployment.key("analyst"),
            broker_key=deployment.public["intruder"],
            timeout=30,
        )
    assert time.monotonic() - started < 5
    intruder = deployment.public["intruder"]
    wait_until(
        lambda: (
            "refused a connection" in deployment.log("broker")
            and intruder in deployment.log("broker")
        ),
        what="the broker to log the refusal",
    )
    assert rank_rows(deployment)[0]["state"] == "up"


def test_a_plaintext_client_gets_nothing_from_a_secure_broker(deployment: Deployment) -> None:
    up(deployment)
    ctx = zmq.Context()
    sock = configure(ctx.socket(zmq.DEALER), linger_ms=0)
    try:
        sock.connect(deployment.address)
        sock.send_multipart(to_wire(encode(StatusRequest(1))))
        assert sock.poll(500) == 0  # no answer, no error, nothing
    finally:
        sock.close()
        ctx.term()
    assert "StatusRequest" not in deployment.log("broker")
    rows = rank_rows(deployment)
    assert all(r["state"] == "up" for r in rows.values())


def test_a_worker_with_another_nodes_key_cannot_take_a_rank(deployment: Deployment) -> None:
    up(deployment)
    genuine = rank_rows(deployment)[0]["pid"]
    started = time.monotonic()
    impostor = deployment.start_worker(0, key="node1", name="impostor")
    assert impostor.wait(5) != 0
    assert time.monotonic() - started < 5
    assert "may not speak for rank 0" in deployment.log("impostor")
    # a key the spec does not pin at all is stopped in the handshake
    outsider = deployment.start_worker(1, key="intruder", name="outsider")
    assert outsider.wait(5) != 0
    assert "refused this worker's key" in deployment.log("outsider")
    rows = rank_rows(deployment)
    assert rows[0]["state"] == "up" and rows[0]["pid"] == genuine
    # the genuine rank 0 still works
    analyst = mp.connect(
        deployment.address, key=deployment.key("analyst"), cluster=deployment.cluster_file
    )
    with contextlib.closing(analyst), analyst:
        assert mp.fetch(mp.device("P0")(lambda: 7)()) == 7


def test_forged_sources_on_a_workers_data_and_spu_ports_are_refused_and_counted(
    tmp_path: Path,
) -> None:
    d = Deployment(tmp_path, world=3)
    try:
        data_port, spu_port = free_port(), free_port()
        ports = ["--data-port", str(data_port), "--spu-port", str(spu_port)]
        up(d, world=3, extra={0: ports})
        assert rank_rows(d)[0].get("protocol_errors", 0) == 0
        ctx = zmq.Context()
        node2 = Curve(load_keypair(d.key("node2")), d.spec)  # a genuine party's key
        socks = []
        try:
            for port in (data_port, spu_port):
                sock = configure(ctx.socket(zmq.PUSH), linger_ms=1000)
                node2.dial(sock, d.spec.nodes[0].curve_key)
                sock.connect(f"tcp://127.0.0.1:{port}")
                socks.append(sock)
            # rank 2 pretends to be rank 1, on both the data plane and the SPU link
            socks[0].send_multipart(to_wire(encode(Move("s", "j", 0, 0, 1, 0, np.arange(3.0)))))
            socks[1].send_multipart([SPU_MAGIC, b"s/SP0/x/0", b"1", b"k", b"forged"])
            wait_until(
                lambda: rank_rows(d)[0].get("protocol_errors", 0) == 2,
                timeout=20,
                what="both forgeries counted on rank 0",
            )
            # speaking as itself is not an error: the move passes the source check and is
            # held for a job that never comes (and dropped after HOLD_S); the same stats
            # row that shows it taken still counts only the two forgeries
            socks[0].send_multipart(to_wire(encode(Move("s", "j", 0, 0, 2, 0, np.arange(3.0)))))
            row = wait_until(
                lambda: (r := rank_rows(d)[0])["moves_held"] + r["moves_dropped"] >= 1 and r,
                timeout=20,
                what="rank 0 to take the genuine move",
            )
            assert row["protocol_errors"] == 2
        finally:
            for s in socks:
                s.close()
            ctx.term()
        assert "claiming src 1 from rank 2" in d.log("worker0")
        assert "forging source 1" in d.log("worker0")
    finally:
        d.close()


def test_non_loopback_plaintext_needs_insecure(tmp_path: Path) -> None:
    broker = [*daemon_command("mpl-broker"), "--listen", "tcp://0.0.0.0:0", "--world-size", "2"]
    refused = subprocess.run(broker, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2
    assert "mpl-keys" in refused.stderr and "--insecure" in refused.stderr
    worker = [*daemon_command("mpl-worker"), "--broker", "tcp://127.0.0.1:1", "--rank", "0"]
    refused = subprocess.run(
        [*worker, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 2
    assert "mpl-keys" in refused.stderr and "--insecure" in refused.stderr
    d = Deployment(tmp_path, outsiders=())
    try:
        proc = d.start("plain", [*broker, "--insecure"])
        wait_until(lambda: "listening on tcp://0.0.0.0:" in d.log("plain"), what="it to listen")
        assert proc.poll() is None
    finally:
        d.close()
