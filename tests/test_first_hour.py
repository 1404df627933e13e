"""A new user's first hour: the common mistakes end, and say what went wrong and what to do.

Each test is one mistake a newcomer makes (an endpoint without ``tcp://``, a broker not
started or started twice on one port, a worker never started, a secret key others may
read), run against the real commands, the real daemons on loopback, or the driver.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from pathlib import Path

import pytest

import mpl.driver as mp
from mpl.driver.launcher import daemon_command
from mpl.wire.endpoints import check_endpoint

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
