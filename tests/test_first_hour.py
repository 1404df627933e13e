"""A new user's first hour: the common mistakes end, and say what went wrong and what to do.

Each test is one mistake a newcomer makes (an endpoint without ``tcp://``, a broker not
started or started twice on one port, a worker never started, a secret key others may
read), run against the real commands, the real daemons on loopback, or the driver.
"""

from __future__ import annotations

import _thread
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import nap_then, wait_until

import mpl.driver as mp
from mpl.broker.query import query_status
from mpl.driver.launcher import daemon_command
from mpl.wire import ClusterSpec, MplTimeoutError, WorkerLostError
from mpl.wire.control import Welcome, WorkerHello
from mpl.wire.endpoints import check_endpoint
from mpl.wire.keys import load_keypair, write_keypair
from mpl.worker.state import UNANSWERED_S, WorkerState
from mpl.worker.state_events import Send, Tick, Unanswered

pytestmark = pytest.mark.daemons


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- endpoints ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "bind", "says"),
    [
        ("127.0.0.1:5555", False, "tcp://127.0.0.1:5555"),
        ("http://127.0.0.1:5555", False, "tcp://HOST:PORT"),
        ("tcp://127.0.0.1", False, "no port"),
        ("tcp://127.0.0.1:99999", True, "0 (any free port) to 65535"),
        ("tcp://127.0.0.1:0", False, "1 to 65535"),
        ("tcp://127.0.0.1:55x", False, "1 to 65535"),
        ("", False, "tcp://HOST:PORT"),
    ],
)
def test_a_mistyped_endpoint_is_refused_showing_the_form(url: str, bind: bool, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        check_endpoint(url, bind=bind)


@pytest.mark.parametrize(
    ("url", "bind"),
    [
        ("tcp://127.0.0.1:5555", False),
        ("tcp://localhost:1", False),
        ("tcp://[::1]:5555", False),
        ("tcp://127.0.0.1:0", True),
        ("tcp://*:5555", True),
        ("tcp://127.0.0.1:*", True),
        ("ipc:///tmp/mpl.sock", False),
        ("inproc://mpl-sim-1", False),
    ],
)
def test_endpoints_zeromq_takes_pass(url: str, bind: bool) -> None:
    assert check_endpoint(url, bind=bind) == url


def test_connect_without_tcp_fails_at_once_instead_of_waiting_for_ever() -> None:
    """Before: the heartbeat thread died on libzmq's "Invalid argument" and the open waited
    on a socket that was never connected, for ever. Now nothing starts: no thread, no wait."""
    threads = {t.ident for t in threading.enumerate()}
    with pytest.raises(ValueError, match=re.escape("write tcp://127.0.0.1:9")):
        mp.connect("127.0.0.1:9", timeout=60)
    assert {t.ident for t in threading.enumerate()} <= threads


@pytest.mark.parametrize(
    "argv",
    [
        ["mpl-broker", "--world-size", "2", "--listen", "127.0.0.1:5555"],
        ["mpl-broker", "--world-size", "2", "--listen", "tcp://127.0.0.1:99999"],
        ["mpl-broker", "status", "127.0.0.1:5555"],
        ["mpl-worker", "--broker", "127.0.0.1:5555", "--rank", "0"],
    ],
)
def test_the_commands_refuse_a_mistyped_endpoint_as_a_usage_error(argv: list[str]) -> None:
    """Before: the broker called 127.0.0.1:5555 "not a loopback address", bound another port
    than 99999 without a word, and the worker said "Invalid argument"."""
    out = _run(*daemon_command(argv[0]), *argv[1:])
    assert out.returncode == 2, out
    assert "tcp://" in out.stderr and "Usage:" in out.stderr


def test_a_busy_port_names_the_way_out(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        listen = f"tcp://127.0.0.1:{port}"
        out = _run(*daemon_command("mpl-broker"), "--world-size", "2", "--listen", listen)
    assert out.returncode == 1
    assert "in use" in out.stderr and "0 picks a free one" in out.stderr


def test_an_unusable_data_root_names_the_option(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    out = _run(
        *daemon_command("mpl-worker"),
        "--broker",
        f"tcp://127.0.0.1:{_free_port()}",
        "--rank",
        "0",
        "--data-root",
        str(tmp_path / "a_file" / "rank0"),
    )
    assert out.returncode == 2 and "--data-root" in out.stderr, out


# -- a broker that is not there ------------------------------------------------------------
def test_a_driver_without_a_broker_is_told_to_check_it() -> None:
    url = f"tcp://127.0.0.1:{_free_port()}"
    with pytest.raises(MplTimeoutError, match="is mpl-broker running at that address"):
        mp.connect(url, timeout=30)


def test_status_without_a_broker_is_told_to_check_it() -> None:
    url = f"tcp://127.0.0.1:{_free_port()}"
    out = _run(*daemon_command("mpl-broker"), "status", url, "--timeout", "0.3")
    assert out.returncode == 1 and "is mpl-broker running at that address" in out.stderr


def test_a_worker_whose_hellos_go_unanswered_says_so_once() -> None:
    """The state machine: one Unanswered after UNANSWERED_S of joining, none before, and one
    again for the next attempt after a welcome."""
    state = WorkerState(WorkerHello(0, "inc", 1, "h", "tcp://d", "", []), now=0.0)
    told: list[float] = []
    now = 0.0
    while now < 3 * UNANSWERED_S:
        out = state.handle(Tick(), now)
        told += [a.seconds for a in out if isinstance(a, Unanswered)]
        assert not out or isinstance(out[-1], Send)  # the hellos go on
        now += 0.05
    assert len(told) == 1 and UNANSWERED_S <= told[0] < UNANSWERED_S + 2.5
    state.handle(Welcome(0, 2, "B1", 1.0, {}), now)
    later = now + 10 * UNANSWERED_S  # the broker fell silent: the worker joins anew
    again = [state.handle(Tick(), later + i * 0.05) for i in range(int(4 * UNANSWERED_S / 0.05))]
    assert sum(isinstance(a, Unanswered) for out in again for a in out) == 1


def test_a_worker_started_before_its_broker_says_what_to_check(tmp_path: Path) -> None:
    url = f"tcp://127.0.0.1:{_free_port()}"
    log = tmp_path / "worker.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*daemon_command("mpl-worker"), "--broker", url, "--rank", "0"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=tmp_path,
        )
    try:
        wait_until(lambda: "no answer from the broker" in log.read_text(), 30, "the warning")
        text = log.read_text()
        assert url in text and "--key and --cluster" in text
        assert proc.poll() is None  # still trying: the broker may yet start
    finally:
        proc.terminate()
        proc.wait(10)


# -- a worker that is not there ------------------------------------------------------------
def test_a_rank_never_started_names_the_command_that_starts_it(tmp_path: Path) -> None:
    from mpl.driver.launcher import ProcessCluster

    spec = ClusterSpec.simple(2, enable_spu=False)
    cluster = ProcessCluster(spec, run_dir=tmp_path / "run")
    try:
        cluster.kill_worker(1)
        ctx = mp.connect(cluster.address)
        try:
            with ctx:
                assert mp.fetch(mp.device("P0")(int)(3)) == 3

                def lost() -> bool:
                    try:
                        mp.device("P1")(int)(3)
                    except WorkerLostError as exc:
                        return "mpl-worker --broker URL --rank 1" in str(exc)
                    return False

                wait_until(lost, 10, "rank 1's job to fail naming mpl-worker")
        finally:
            ctx.close()
    finally:
        cluster.close()


# -- a context's session -------------------------------------------------------------------
def _sessions(url: str) -> list[Any]:
    return list(query_status(url, timeout=5)["sessions"])


def test_with_makes_a_context_current_and_close_ends_its_session(make_cluster: Any) -> None:
    """What the Quick start says: ``with ctx:`` enters (and may enter again), ``close``
    ends the session on the broker at once, not at its lease."""
    cluster = make_cluster("tcp")
    ctx = mp.connect(cluster.address, lease_s=600)
    with ctx:
        assert mp.fetch(mp.device("P0")(int)(3)) == 3
    with ctx:
        assert mp.fetch(mp.device("P1")(int)(4)) == 4
    assert [s["session"] for s in _sessions(cluster.address)] == [ctx.session]
    ctx.close()
    wait_until(lambda: not _sessions(cluster.address), 10, "the session to close")


# -- keys ----------------------------------------------------------------------------------
def test_a_secret_key_others_may_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, secret, _ = write_keypair(tmp_path, "node0")
    with caplog.at_level(logging.WARNING, logger="mpl.keys"):
        load_keypair(secret)  # 0600, as mpl-keys made it
        assert not caplog.records
        os.chmod(secret, 0o644)
        load_keypair(secret)
    (record,) = caplog.records
    assert "chmod 600" in record.getMessage() and str(secret) in record.getMessage()


def test_making_a_key_twice_points_to_force(tmp_path: Path) -> None:
    keys = [sys.executable, "-c", "from mpl.wire.keytool import main; main()"]
    assert _run(*keys, "new", "node0", "--dir", str(tmp_path)).returncode == 0
    again = _run(*keys, "new", "node0", "--dir", str(tmp_path))
    assert again.returncode == 1 and "--force" in again.stderr


# -- the examples --------------------------------------------------------------------------
def test_an_example_on_too_small_a_cluster_says_how_many_parties_it_needs(
    make_cluster: Any,
) -> None:
    """Before: a DeviceNotFoundError ('no device P2') or a GraphError ('rank out of range')
    from deep inside the example, on the 2 workers scripts/cluster-up.sh starts by default."""
    cluster = make_cluster("tcp")
    example = Path(__file__).resolve().parent.parent / "examples" / "party_stats.py"
    out = _run(sys.executable, str(example), "--url", cluster.address, timeout=120)
    assert out.returncode == 2, out
    assert "needs 3 parties" in out.stderr and "cluster-up.sh 3" in out.stderr
    wait_until(lambda: not _sessions(cluster.address), 10, "the example's session to close")


# -- the scripts ---------------------------------------------------------------------------
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_the_cluster_scripts_help_and_touch_nothing(tmp_path: Path) -> None:
    """Before: cluster-down.sh --help stopped the running cluster (it took no arguments and
    read none), and cluster-up.sh --help called --help a bad number of workers."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "worker0.pid").write_text(f"{bystander.pid}\n")
        env = {**os.environ, "MPL_RUN_DIR": str(tmp_path)}
        for script in ("cluster-up.sh", "cluster-down.sh"):
            out = subprocess.run(
                [str(SCRIPTS / script), "--help"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.returncode == 0 and "MPL_RUN_DIR" in out.stdout, out
        wrong = subprocess.run(
            [str(SCRIPTS / "cluster-down.sh"), "3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert wrong.returncode == 2 and "usage" in wrong.stderr
        assert bystander.poll() is None  # nothing was stopped
        assert sorted(p.name for p in tmp_path.iterdir()) == ["worker0.pid"]  # nor started
    finally:
        bystander.kill()
        bystander.wait(10)


# -- Ctrl-C --------------------------------------------------------------------------------
def test_ctrl_c_in_a_waiting_driver_cancels_its_job(make_cluster: Any) -> None:
    """Before: the interrupted job ran on for as long as it took (here a minute), holding
    its ranks and counted in flight, though no one would read its answer."""
    cluster = make_cluster("tcp")

    def in_flight() -> int:
        return int(query_status(cluster.address, timeout=5)["jobs_in_flight"])

    def interrupt_once_running() -> None:
        wait_until(lambda: in_flight() == 1, 30, "the job to start")
        _thread.interrupt_main()  # what Ctrl-C does to the waiting main thread

    ctx = mp.connect(cluster.address)
    try:
        with ctx:

            @mp.function  # one job: rank 1 waits for rank 0's value, a minute in the making
            def slow() -> Any:
                return mp.device("P1")(int)(mp.device("P0")(nap_then)(1, 60.0))

            interrupter = threading.Thread(target=interrupt_once_running, daemon=True)
            interrupter.start()
            with pytest.raises(KeyboardInterrupt):
                mp.fetch(slow())
            interrupter.join(30)
            wait_until(lambda: in_flight() == 0, 10, "the broker to drop the job")
            assert query_status(cluster.address, timeout=5)["jobs_failed"] == 1  # cancelled
            assert mp.fetch(mp.device("P1")(int)(2)) == 2  # the session goes on
    finally:
        ctx.close()
