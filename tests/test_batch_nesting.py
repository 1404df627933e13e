"""A batch's frame is read item by item, by the bins' heads, never by msgpack as a whole:
arrays nested in it (a tree whose leaves are empty arrays, one byte each) would otherwise
build a Python list per byte received (~60 bytes of memory per byte), around the
MAX_CONTAINERS bound ``decode`` puts on a header, before being refused. Any peer that can
send the broker a message can send a batch (in plaintext anyone on loopback), and a
hostile broker can send one to every worker and driver: each reads it with
``mpl.wire.batch.split_batch``. Found in review of wire v4; these tests fail on its first
form (``msgpack.unpackb`` of the whole frame).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import wait_until

from mpl.driver.launcher import daemon_command
from mpl.wire.batch import BATCH_MAGIC, split_batch
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.control import Refused
from mpl.wire.errors import ProtocolError
from mpl.wire.sessions import Reply, StatusRequest

_ARRAY16_OF_64 = b"\xdc\x00\x40"


def _tree(depth: int) -> bytes:
    """A msgpack array tree, 64 wide, ``depth`` levels above its leaves (empty arrays)."""
    return b"\x90" if depth == 0 else _ARRAY16_OF_64 + _tree(depth - 1) * 64


def _nested_batch_body(top: int, depth: int) -> bytes:
    """A batch's array of ``top`` items (within MAX_BATCH), each a tree of empty arrays."""
    return b"\xdc" + top.to_bytes(2, "big") + _tree(depth) * top


def test_split_batch_builds_no_more_than_its_frame_before_refusing_a_nested_batch() -> None:
    body = _nested_batch_body(64, 2)  # 64 * 64 * 64 empty arrays: 270 KB
    size = len(body)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            split_batch([BATCH_MAGIC, body])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a bounded reader copies the frame once (and builds a handful of objects)
    assert peak <= 4 * size, f"{peak} bytes built for a frame of {size}"


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real ``mpl-broker`` for 2 ranks on a free loopback port: its address and pid;
    stopped by its pid at the end."""
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        cmd = [*daemon_command("mpl-broker"), "--listen", "tcp://127.0.0.1:0", "--world-size", "2"]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        found = wait_until(
            lambda: re.search(r"mpl-broker listening on (\S+)", log.read_text()),
            20,
            "the broker to listen",
        )
        yield found.group(1), proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmHWM:\s+(\d+) kB", text)
    assert found is not None
    return int(found.group(1)) * 1024


@contextlib.contextmanager
def raw_dealers(address: str, count: int = 1) -> Iterator[list[zmq.Socket[Any]]]:
    """``count`` raw DEALER sockets connected to the broker at ``address``, on a context of
    their own: closed, and the context ended, at the end of the block."""
    ctx: zmq.Context[Any] = zmq.Context()
    socks = [ctx.socket(zmq.DEALER) for _ in range(count)]
    try:
        for sock in socks:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        yield socks
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()


def _answer(sock: zmq.Socket[Any], kind: type, timeout_ms: int = 60_000) -> Any:
    """The first message of type ``kind`` the broker sends ``sock`` (polled, bounded)."""
    while sock.poll(timeout_ms):
        msg = decode(from_wire(sock.recv_multipart()), unpickle=False)
        if isinstance(msg, kind):
            return msg
    raise AssertionError(f"no {kind.__name__} from the broker")


@pytest.mark.timeout(120)
def test_a_nested_batch_does_not_make_the_broker_build_many_times_its_size(
    broker_process: tuple[str, int],
) -> None:
    address, pid = broker_process
    with raw_dealers(address) as [sock]:
        sock.send_multipart(to_wire(encode(StatusRequest(1))))  # the broker is up and warm
        assert isinstance(_answer(sock, Reply), Reply)
        before = _peak_rss(pid)
        body = _nested_batch_body(16, 3)  # 16 * 64**3 empty arrays: 4.4 MB
        size = len(body)
        sock.send_multipart([BATCH_MAGIC + body])  # wire v4: a batch is one frame
        refused = _answer(sock, Refused)
        assert "batch" in refused.error.message
        grown = _peak_rss(pid) - before
        # receiving and refusing it needs its frame and a copy or two of it, no more
        assert grown <= 8 * size, f"the broker grew {grown >> 20} MiB for {size} B"
        sock.send_multipart(to_wire(encode(StatusRequest(2))))  # and it still serves
        assert isinstance(_answer(sock, Reply), Reply)


@pytest.mark.timeout(120)
def test_a_nested_batch_from_a_hostile_broker_does_not_make_a_worker_build_many_times_its_size(
    tmp_path: Path,
) -> None:
    from test_batch import FakeBroker, _one_rank_program

    from mpl.wire.jobs import Exec, Program

    ctx: zmq.Context[Any] = zmq.Context()
    broker = FakeBroker(ctx)
    proc = broker.start_worker(tmp_path)
    try:
        broker.welcome(5.0, 20)  # heartbeats far apart: the worker's stall is no silence
        graph = _one_rank_program()
        broker.send(encode(Program(graph.digest, graph)))
        broker.send(encode(Exec("s", "warm", graph.digest, (0,), {}, (0,))))
        broker.wait_dones(1)  # the worker is up and warm
        before = _peak_rss(proc.pid)
        body = _nested_batch_body(16, 3)  # 16 * 64**3 empty arrays: 4.4 MB
        size = len(body)
        broker.send_wire([BATCH_MAGIC + body])  # wire v4: a batch is one frame
        broker.send(encode(Exec("s", "after", graph.digest, (0,), {}, (0,))))
        broker.wait_dones(2)  # the batch was read (and refused) before this job ran
        assert broker.dones[1].job == "after"
        grown = _peak_rss(proc.pid) - before
        assert grown <= 8 * size, f"the worker grew {grown >> 20} MiB for {size} B"
    finally:
        proc.terminate()
        proc.wait(10)
        broker.router.close(linger=0)
        ctx.term()
