"""Bounds on tables fed by the network: the SPU mailbox, and the program caches (in entries
and in bytes, the broker's mirror of each worker's cache in step with it)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from functools import partial

import pytest
from helpers import decoded_as

import mpl.broker.program_store as program_store
import mpl.broker.registry as registry
import mpl.worker.state as worker_state
from mpl.broker.registry import WorkerEntry
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.codec import encode
from mpl.wire.control import Refused, WorkerHello
from mpl.wire.graph import Graph
from mpl.wire.jobs import Program, program_nbytes
from mpl.wire.sealed import Sealed
from mpl.worker.keyed_mailbox import spu_mailbox
from mpl.worker.state import WorkerState

LANE = "s/SP0/t/0"


def test_the_spu_mailbox_is_bounded_in_entries_and_counts_what_it_drops() -> None:
    box = spu_mailbox(max_entries=4, max_bytes=1 << 20)
    box.open(LANE)
    for i in range(10):  # a member floods a real lane with distinct keys
        box.put((LANE, 1, f"k{i}"), b"x")
    assert box.pending() == (4, 4) and box.overflow == 6
    deadline = time.monotonic() + 1
    assert box.take((LANE, 1, "k0"), deadline, "") == b"x"  # a receive makes room
    box.put((LANE, 1, "k4"), b"y")
    assert box.pending() == (4, 4) and box.overflow == 6


def test_the_spu_mailbox_is_bounded_in_bytes_and_frees_them_with_the_lane() -> None:
    box = spu_mailbox(max_entries=1000, max_bytes=100)
    box.open(LANE)
    box.put((LANE, 1, "a"), b"x" * 60)
    box.put((LANE, 1, "b"), b"x" * 60)  # 120 bytes would pass the bound: dropped
    assert box.pending() == (1, 60) and box.overflow == 1
    box.close(LANE, "dropped")
    assert box.pending() == (0, 0)
    assert not box.put((LANE, 1, "c"), b"late") and box.late == 1
    other = "s2/SP0/t/0"
    box.open(other)
    box.put((other, 1, "a"), b"x" * 90)
    assert box.pending() == (1, 90)
    box.close_where(lambda lane: lane.startswith("s2/"), "closed")
    assert box.pending() == (0, 0)


def _program(size: int, tag: int) -> Program:
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=(1,), value=bytes([tag % 256]) * size + str(tag).encode())[0]
    g = b.build([v])
    return Program(g.digest, g)


def _mirrored_worker(monkeypatch: pytest.MonkeyPatch) -> tuple[WorkerEntry, WorkerState]:
    """The broker's entry of rank 1's worker (its mirror of the worker's program cache) and
    that worker's state, their caches bounded at 40,000 and 60,000 bytes."""
    monkeypatch.setattr(registry, "PROGRAM_MIRROR_BYTES", 40_000)
    monkeypatch.setattr(worker_state, "WORKER_PROGRAM_BYTES", 60_000)
    mirror = WorkerEntry(1, b"w1", WorkerHello(1, "i", 1, "h", "tcp://d", ""), 0.0, 0.0)
    worker = WorkerState(WorkerHello(1, "i", 1, "h", "tcp://d", ""), now=0.0, heartbeat_s=1.0)
    return mirror, worker


def test_program_caches_count_bytes_and_the_broker_mirror_stays_in_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror, worker = _mirrored_worker(monkeypatch)
    rng = random.Random(7)
    made: list[Program] = []
    for step in range(400):  # new programs of many sizes, and jobs reusing older ones
        if not made or rng.random() < 0.4:
            made.append(_program(rng.randrange(200, 12_000), step))
            p = made[-1]
        else:
            p = rng.choice(made)
        if mirror.needs_program(("d", p.digest), partial(program_nbytes, p, 1)):
            worker.handle(Program(p.digest, p.graph), 0.0)  # what the broker forwards
        assert worker.program(p.digest) is not None  # the job finds its program
        assert worker.programs.nbytes <= 60_000 and mirror.programs.nbytes <= 40_000
    assert len(worker.programs) < len(made)  # before, 512 entries of any size were kept


def drivers_copies(
    rng: random.Random, made: list[Program], junk: Graph | None, jobs: int
) -> Iterator[tuple[str, Program, bool]]:
    """``jobs`` jobs, each of a program drawn from ``made`` by driver a, b or c: b's copy of
    every other program of ``made`` is ``junk`` under the genuine digest. Yields the driver,
    the copy it sends and whether that copy is genuine."""
    for _ in range(jobs):
        n = rng.randrange(len(made))
        p, driver = made[n], rng.choice("abc")
        genuine = driver != "b" or n % 2 == 0
        yield driver, Program(p.digest, p.graph if genuine else junk), genuine


def test_a_mirror_keyed_by_driver_only_errs_towards_sending_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Several drivers' keys stand for one worker entry (the worker caches by digest), and a
    # copy may be junk under a digest it does not have (the worker refuses it and keeps any
    # genuine one). Whatever the mirror believes a worker holds of a genuine copy, it does.
    mirror, worker = _mirrored_worker(monkeypatch)
    rng = random.Random(11)
    made = [_program(rng.randrange(200, 6_000), step) for step in range(40)]
    index = {p.digest: n for n, p in enumerate(made)}
    junk = _program(300, 999).graph  # b's copy of every other digest: another graph
    sent = 0
    for driver, copy, genuine in drivers_copies(rng, made, junk, 1_500):
        if mirror.needs_program((driver, copy.digest), partial(program_nbytes, copy, 1)):
            sent += 1
            worker.handle(copy, 0.0)
        held = worker.program(copy.digest)  # the job's look-up (it touches the entry)
        assert held is not None or not genuine  # a genuine copy's job finds it
        for (owner, digest), _ in mirror.programs.items():  # what the broker believes
            assert digest in worker.programs or (owner == "b" and index[digest] % 2)
    assert 0 < sent < 1_500 and mirror.programs.dropped > 0


def test_the_broker_refuses_a_program_beyond_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program_store, "MAX_PROGRAM_BYTES", 5_000)
    s = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    small, big = _program(100, 1), _program(10_000, 2)
    assert s.handle(b"d", small, 0.0) == []
    out = s.handle(b"d", big, 0.0)
    assert isinstance(out[0].msg, Refused)
    assert "exceeds MAX_PROGRAM_BYTES" in out[0].msg.error.message
    assert s.counters["protocol_errors"] == 1 and len(s.programs) == 1
    # sealed for each rank: judged by what one worker would cache, not by the sum
    box = Sealed("d", b"salt", [2000], [b"h" * 40, b"c" * 2016])
    assert s.handle(b"d", Program("many", None, {r: box for r in range(3)}), 0.0) == []
    huge = Sealed("d", b"salt", [6000], [b"h" * 40, b"c" * 6016])
    assert s.handle(b"d", Program("huge", None, {0: huge}), 0.0)
    assert s.counters["protocol_errors"] == 2 and len(s.programs) == 2


def test_a_sealed_program_is_counted_alike_decoded_opaque_or_not() -> None:
    box = Sealed("d", b"salt", [5000], [b"h" * 40, b"c" * 5016])
    sealed = Program("digest", None, {0: box, 1: box})
    frames = encode(sealed)
    # buffers kept opaque, as the broker does
    at_broker = decoded_as(Program, frames, unpickle=False)
    at_worker = decoded_as(Program, frames)
    assert program_nbytes(at_broker, 0) == program_nbytes(at_worker, 0) == 4 + 40 + 5016
    assert program_nbytes(at_broker) == 2 * program_nbytes(at_broker, 1)


def test_a_programs_digest_is_bounded_in_length_at_the_broker_and_the_worker() -> None:
    """Attack: a sealed program's digest is its driver's word until a worker opens it, and
    the program caches count a program's bytes, not its key's: a driver's sealed programs
    with 16 MiB digests (a header's limit) and 70-byte boxes were kept, 1,024 of them, in
    the broker's cache (16 GiB charged as 70 KiB), and again in each worker's mirror and
    in the worker's table of broken programs (the digest twice, in the error text too)."""
    s = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    box = Sealed("d", b"salt", [10], [b"h" * 40, b"c" * 26])
    long = "f" * 1_000_000
    out = s.handle(b"d", Program(long, None, {0: box}), 0.0)
    assert len(out) == 1 and isinstance(out[0].msg, Refused), out
    assert "digest" in out[0].msg.error.message and long not in out[0].msg.error.message
    assert len(s.programs) == 0 and s.counters["protocol_errors"] == 1
    assert s.handle(b"d", Program("f" * 32, None, {0: box}), 0.0) == []  # as frames_digest
    worker = WorkerState(WorkerHello(1, "i", 1, "h", "tcp://d", ""), now=0.0, heartbeat_s=1.0)
    worker.handle(Program(long, _program(10, 1).graph), 0.0)  # a hostile broker's, opened
    assert worker.refused_programs == 1
    assert long not in worker.broken and not any(long in why for why in worker.broken.values())


def test_a_secure_worker_keeps_nothing_under_a_long_digest_a_broker_sent() -> None:
    """The same from a hostile broker to a secure worker: a sealed program that does not
    open was remembered under its digest, with the digest in the reason too."""
    from test_session_driver_binding import _sealers

    from mpl.worker.sealing import WorkerSeal

    worker = WorkerSeal(_sealers()[2], 0)
    junk = Sealed("d", b"salt", [10], [b"h" * 40, b"c" * 26])
    long = "f" * 1_000_000
    assert worker.inbound(Program(long, None, {0: junk})) == (None, None)
    assert worker.refusals == 1
    assert not any(len(key) > 64 or len(why) > 4096 for key, why in worker._refused.items())
