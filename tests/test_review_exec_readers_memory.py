"""Review finding (fixed: only headers under 1 KiB are kept, for at most 64 senders): the
broker's per-sender repeat-Exec readers kept what hostile Execs built.

Since the broker reads a sender's Execs by comparison with that sender's last one
(``Broker._exec_of``, ``mpl.wire.exec_repeat.RepeatExecs``), it keeps, for each of up to
256 senders, the last Exec it read in full *as Python objects* (the record's fields). A
header shorter than 8 KiB can build some 8,000 empty containers in its bindings (about
600 KB of objects), and the reader is made and filled before any check of who sent it:
a peer that is no driver, or an Exec refused for a session it may not use, leaves its
objects behind until 256 other senders push them out. 256 connections from one hostile
peer make a running broker hold about 150 MB it did not hold before this round (the full
read it replaced built the same objects and dropped them after the message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq
from helpers import wait_until

from mpl.wire.batch import is_batch, split_batch
from mpl.wire.codec import SLICE_BELOW, encode, from_wire
from mpl.wire.jobs import Exec

_SENDERS = 256  # more than mpl.broker.inbox._EXEC_READERS (64): every reader the broker keeps


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _fat_exec(job: str, n: int) -> bytes:
    """One frame (magic and header) of an Exec whose bindings build ``n`` empty dicts: what
    a full read builds, and the reader keeps."""
    frames = encode(Exec("no-such-session", job, "d" * 8, (0,), {0: [{}] * n}, (), 0.0))
    assert len(frames) == 2
    return b"".join(bytes(f) for f in frames)


def _most_dicts() -> int:
    """The most empty dicts an Exec of one frame shorter than SLICE_BELOW can bind."""
    n, step = 1, 1024
    while step:
        if len(_fat_exec("j" * 12, n + step)) < SLICE_BELOW - 8:
            n += step
        else:
            step //= 2
    return n


def test_hostile_execs_leave_no_objects_behind_in_the_broker(make_cluster: Any) -> None:
    n = _most_dicts()
    cluster = make_cluster("tcp", world_size=1)
    pid = cluster.impl.broker.pid
    ctx: zmq.Context[Any] = zmq.Context()
    socks: list[zmq.Socket[Any]] = []
    try:

        def send_two(sock: zmq.Socket[Any], tag: int) -> None:
            # the first message of a connection is read the general way (its fd noted);
            # the second goes through the per-sender reader, which keeps it
            for k in range(2):
                sock.send(_fat_exec(f"j{tag:08d}-{k}", n))
            got = 0
            while got < 2:
                assert sock.poll(20000), "the broker answers each Exec (no such session)"
                answer = from_wire(sock.recv_multipart(copy=False))
                # two answers may come as one batch
                got += len(split_batch(answer)) if is_batch(answer) else 1

        def connect() -> zmq.Socket[Any]:
            sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(cluster.address)
            socks.append(sock)
            return sock

        send_two(connect(), -1)  # warm: the broker's first reader and its allocator
        wait_until(lambda: _rss_bytes(pid) > 0, what="the broker's RSS")
        before = _rss_bytes(pid)
        for i in range(_SENDERS - 1):
            send_two(connect(), i)
        grown = _rss_bytes(pid) - before
    finally:
        for s in socks:
            s.close(linger=0)
        ctx.term()
    # the old broker read each Exec in full and dropped it: a few MB at most
    assert grown < 40 * 1024 * 1024, f"the broker grew by {grown / 1e6:.0f} MB"
