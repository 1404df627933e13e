"""A rank's run stats travel as one opaque blob (``mpl.wire.run_stats``): packed once by
the worker, copied by the broker unread, decoded by the driver only when a trace asks.

Counted, not timed: the containers built for stats on a job's path (none now: a map, an ops
list and a list per op per rank before). And hostile blobs through a real broker
(oversized, malformed, deeply nested, not bytes at all) leave the job's result intact,
give a clean "stats unreadable" where they are read, and the broker serving.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from helpers import joined_workers, session_with_program, wait_until
from test_hot_path import Raw

import mpl.driver as mp
from mpl.driver.context import JobRecord
from mpl.driver.launcher import daemon_command
from mpl.driver.tracefile import write_trace
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, to_wire
from mpl.wire.control import Heartbeat
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Exec, JobResult
from mpl.wire.result_read import read_answer
from mpl.wire.run_stats import MAX_STATS_BYTES, RunStats, pack_stats, read_stats, run_seconds
from mpl.wire.sessions import Reply, StatusRequest

WORLD_SIZE = 2


def _containers(obj: Any) -> int:
    """Lists, dicts and tuples in ``obj``, itself included."""
    if isinstance(obj, dict):
        return 1 + sum(_containers(k) + _containers(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return 1 + sum(map(_containers, obj))
    return 0


# -- the blob itself ----------------------------------------------------------------------


def test_a_blob_reads_back_what_the_worker_packed() -> None:
    spans = [[0, "0 (pcall f)", 1e-6, 2e-5], [1, "1 (shuffle)", 2e-5, 3e-5]]
    blob = pack_stats(3.5e-5, 1.7645e9, spans)
    assert type(blob) is bytes and run_seconds(blob) == 3.5e-5
    stats = read_stats(blob)
    assert (stats.run_s, stats.started, stats.dropped) == (3.5e-5, 1.7645e9, 0)
    assert stats.ops == [tuple(span) for span in spans]


def test_a_worker_never_packs_past_the_cap_and_says_how_many_spans_it_left_out() -> None:
    spans = [[i, "x" * 200, 0.0, 1.0] for i in range(2000)]  # ~430 KB packed in full
    blob = pack_stats(1.0, 2.0, spans)
    assert len(blob) <= MAX_STATS_BYTES
    stats = read_stats(blob)
    assert stats.ops and len(stats.ops) + stats.dropped == 2000
    assert run_seconds(blob) == 1.0


HOSTILE: dict[str, Any] = {
    "garbage": b"\xc1\xc1\xc1",
    "truncated": pack_stats(1.0, 2.0, [[0, "op", 0.0, 1.0]])[:-3],
    "empty": b"",
    "a map": msgpack.packb({"run_s": 1.0}),
    "an extension": msgpack.packb([1.0, 2.0, [msgpack.ExtType(3, b"pickle")], 0]),
    "deep": b"\x94\xcb" + bytes(8) + b"\xcb" + bytes(8) + b"\x91" * 3000 + b"\x90" + b"\x00",
    "a bad span": msgpack.packb([1.0, 2.0, [[0, "op", "start", 1.0]], 0]),
    "oversized": b"\x94" + b"\xc0" * (MAX_STATS_BYTES + 1),
    "not bytes": {"run_s": 1.0},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_blob_is_a_clean_protocol_error_on_read(name: str) -> None:
    with pytest.raises(ProtocolError, match="stats unreadable"):
        read_stats(HOSTILE[name])


# -- counted on the driver's path ---------------------------------------------------------


@pytest.fixture
def counted_ctx(sim: Any) -> Iterator[Any]:
    with sim:
        yield sim


def test_the_driver_builds_nothing_for_stats_per_job(counted_ctx: Any, tmp_path: Path) -> None:
    """A job's record keeps each rank's stats as the blob that came: no map, ops list or
    span built per rank per job (bac702e: 3 per rank for a one-op job, 6 for two ranks);
    they are read when a trace is written."""
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):
        assert mp.fetch(job()) == [1, 1]
    record = counted_ctx.jobs[-1]
    assert sorted(record.stats) == [0, 1]
    assert sum(_containers(v) for v in record.stats.values()) == 0
    assert all(type(v) is bytes for v in record.stats.values())
    # read on demand: the op spans are there for the trace
    events = json.loads(Path(mp.trace(str(tmp_path / "t.json"), last=1)).read_text())
    spans = [e for e in events["traceEvents"] if e.get("tid") == 1]
    assert sorted(e["pid"] for e in spans) == [0, 1]
    assert all("pcall" in e["name"] for e in spans)


# -- hostile blobs through a real broker --------------------------------------------------


# a Done's values map {0: 1}, or {0: ("x",)}: a tuple of a str, which the broker's lean
# reader leaves to decode (and the answer is then spliced from the Dones' bytes)
PLAIN_VALUES = b"\x81\x00\x01"
TUPLE_VALUES = b"\x81\x00" + msgpack.packb(msgpack.ExtType(4, msgpack.packb(["x"])))


def _done(session: str, job: str, rank: int, values: bytes, stats: bytes) -> list[bytes]:
    """A Done written by hand, as a hostile worker may: ``values`` and ``stats`` as given
    (the packed bytes of those fields)."""
    pack = msgpack.packb
    head = b"".join((b"\x98", pack("done"), pack(session), pack(job), pack(rank)))
    return [MAGIC_FRAME, head + values + stats + b"\x80\x90"]


def _bin(blob: bytes) -> bytes:
    return bytes(msgpack.packb(blob, use_bin_type=True))


# each: the stats field's bytes as the hostile rank 1 writes it, inline in its header
FIELDS: dict[str, bytes] = {
    "oversized": _bin(b"\x00" * (MAX_STATS_BYTES + 1)),
    "malformed": _bin(b"\xc1garbage"),
    "deeply nested blob": _bin(b"\x91" * 5000 + b"\x90"),
    "not bytes": b"\x81\xa3ops" + b"\x91" * 50 + b"\x90",
}


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A real ``mpl-broker`` process for 2 ranks on a free loopback port (no workers: the
    test's raw sockets play them), and a maker of raw sockets on it; every socket closed
    and the process stopped by its pid at the end."""
    import re
    import subprocess

    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        cmd = [*daemon_command("mpl-broker"), "--listen", "tcp://127.0.0.1:0", "--world-size", "2"]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    ctx: zmq.Context[Any] = zmq.Context()
    made: list[Raw] = []
    try:
        found = wait_until(
            lambda: re.search(r"mpl-broker listening on (\S+)", log.read_text()),
            20,
            "the broker to listen",
        )
        address = found.group(1)

        def raw() -> Raw:
            made.append(Raw(ctx, address))
            return made[-1]

        yield address, raw
    finally:
        for r in made:
            r.sock.close(linger=0)
        ctx.term()
        proc.terminate()
        proc.wait(10)


def _counter(raw: Any, name: str) -> int:
    """A counter from the broker's status, asked over a raw socket."""
    asker = raw()
    asker.send(StatusRequest(1))
    reply, _ = asker.wait_for(Reply)
    assert isinstance(reply, Reply) and isinstance(reply.value, dict)
    return int(reply.value.get(name, 0))


@pytest.mark.parametrize("spliced", [False, True])
@pytest.mark.parametrize("name", list(FIELDS))
def test_a_hostile_blob_through_a_real_broker_leaves_the_result_and_the_broker_whole(
    name: str, spliced: bool, tmp_path: Path, broker_process: tuple[str, Any]
) -> None:
    _, raw = broker_process
    workers = joined_workers(raw, 2)
    driver, session, digest = session_with_program(raw, "stats", 2, (0, 1))
    good = _bin(pack_stats(2e-5, 1.7e9, [[0, "0 (constant)", 1e-6, 1.5e-5]]))
    for n, job in enumerate(("hostile", "after")):
        for rank, w in enumerate(workers):  # alive, however slow this machine is today
            w.send(Heartbeat(rank=rank))
        driver.send(Exec(session, job, digest, (0, 1), {}, (0,)))
        for rank, w in enumerate(workers):
            w.wait_for(Exec)
            bad = rank == 1 and n == 0
            values = TUPLE_VALUES if spliced else PLAIN_VALUES
            stats = FIELDS[name] if bad else good
            w.sock.send_multipart(to_wire(_done(session, job, rank, values, stats)))
        _, frames = driver.wait_for(JobResult)
        result = read_answer(frames, safe=True)  # the driver's own reader
        assert isinstance(result, JobResult) and result.job == job and result.error is None
        one = ("x",) if spliced else 1
        assert result.values == {0: {0: one, 1: one}}
        record = JobRecord(job, "g", 1.7e9, 1e-3, result.stats)
        read = record.rank_stats()
        assert isinstance(read[0], RunStats)  # rank 0's is fine
        if n == 0:
            assert isinstance(read[1], ProtocolError) and "stats unreadable" in str(read[1])
            # the trace says so on rank 1's row, and draws rank 0's spans
            path = write_trace([record], ClusterSpec.simple(2), str(tmp_path / "t.json"))
            events = json.loads(Path(path).read_text())["traceEvents"]
            marks = [e for e in events if e.get("name") == "stats unreadable"]
            assert [m["pid"] for m in marks] == [1]
            assert [e["pid"] for e in events if e.get("tid") == 1] == [0]
        else:  # the cluster still serves, and reads both ranks' stats
            assert not any(isinstance(r, ProtocolError) for r in read.values())
    # what the broker checks (a blob within the cap) it dropped and counted; what it
    # does not read (a blob's contents) it forwarded as it came
    dropped = name in ("oversized", "not bytes")
    assert _counter(raw, "stats_refused") == int(dropped)
