"""Review w30 of this round's speed changes (w30-broker, w30-worker), for soundness: what
the fast reading of a message accepts against what the full read accepts, whose message it
is taken for, what it keeps, and what a hostile party can make it do.

Each finding is a test that fails while the attack works: passing where fixed on this
branch, else a strict xfail that says the fix. The rest checks what was found sound, where
the round's own tests did not already (a hostile sender's bytes through the broker's loop).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from helpers import mutated, wait_until
from test_pool_job_sealer import SealedShell
from test_session_driver_binding import _sealers

from mpl.wire import GraphBuilder
from mpl.wire.batch import is_batch, split_batch
from mpl.wire.codec import MAGIC_FRAME, decode, encode, from_wire
from mpl.wire.done_repeat import RepeatDones
from mpl.wire.hot import DONE_PREFIX, read_done_header
from mpl.wire.jobs import Abort, Done, Exec, Failed, output_uri
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.seal import Sealer, exec_context
from mpl.worker.held_recipients import HELD_PER_DRIVER as _HELD
from mpl.worker.sealing import WorkerSeal

_NODE = "node:n0"


class _Gate:
    """A job's one call, which waits until the test opens the gate."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.open = threading.Event()

    def __call__(self) -> int:
        self.started.set()
        self.open.wait(60)
        return 7


# the calls' gates, by name (a program's functions go by reference, not pickled)
_GATES: dict[str, _Gate] = {}


def _victims() -> int:
    return _GATES["victim"]()


def _blockers() -> int:
    return _GATES["blocker"]()


def _fails() -> int:
    raise ValueError("this job fails")


@pytest.fixture
def gates() -> Iterator[dict[str, _Gate]]:
    _GATES.clear()
    _GATES.update((name, _Gate()) for name in ("victim", "blocker"))
    yield _GATES
    for gate in _GATES.values():  # no job thread is left waiting
        gate.open.set()


class _TwoDrivers(SealedShell):
    """Rank 0's seal and job shell (two job threads), wired as the daemon wires them, with
    two listed drivers a and b; answers sealed as the result channel seals them."""

    def __init__(self) -> None:
        self.a, self.b, node = _sealers()
        super().__init__(node, threads=2)

    def run(self, driver: Sealer, session: str, job: str, digest: str) -> None:
        """``driver``'s sealed job, opened by the seal and handed to the job shell, as the
        worker's broker_messages does."""
        msg = Exec(session, job, digest, (0,), {}, (0,), 60.0)
        context = exec_context(session, job, digest, (0,), (0,), 60.0)
        assert self.seal.open_exec(msg, job, driver.seal(None, _NODE, context, safe=False)) is None
        assert not self.jobs.handle(msg)


def test_another_drivers_queued_jobs_do_not_push_out_a_held_recipient(
    gates: dict[str, _Gate],
) -> None:
    """Finding 1 (low: a denial of service by any listed driver, the residue of review
    w30 finding 4). ``WorkerSeal.hold`` keeps the recipient of each job the pool holds,
    4,096 at most, oldest first, across all drivers. A pool task of b's that blocks (a
    slow call, or a job waiting on a peer until its deadline) keeps every later job of b's
    session queued behind it, each held: 4,097 of them push a's running job's recipient
    out, and its Done fails "no authenticated driver here to seal its results for".
    Fixed: the bound is per driver (a driver's jobs push out only its own held jobs; the
    drivers are the node's listed ones)."""
    worker = _TwoDrivers()
    worker.run(worker.a, "sa", "victim", worker.program(_victims))
    assert gates["victim"].started.wait(10)
    blockers = worker.program(_blockers)
    worker.run(worker.b, "sb", "b-first", blockers)
    assert gates["blocker"].started.wait(10)
    for i in range(_HELD + 1):  # queued behind b-first in b's session: each held
        worker.run(worker.b, "sb", f"b{i}", blockers)
    gates["victim"].open.set()
    done = worker.answer("victim")
    assert type(done) is Done, f"a's job's answer: {done!r}"
    _, value = worker.a.open(done.values[0], "done|sa|victim|0", safe=True)
    assert value == 7
    gates["blocker"].open.set()
    wait_until(lambda: not worker.seal._held, what="every held sealer let go", timeout=60)


def test_a_held_recipient_is_let_go_when_its_job_fails_or_is_aborted_queued(
    gates: dict[str, _Gate],
) -> None:
    """Found sound. ``release`` is reached on the error paths too: a pooled job that
    raises (its Failed sealed, then released), and one aborted while it waits its turn
    (the pool still runs its task, which reports the abort and releases)."""
    worker = _TwoDrivers()
    worker.run(worker.a, "sa", "fails", worker.program(_fails))
    assert type(worker.answer("fails")) is Failed
    blockers = worker.program(_blockers)
    worker.run(worker.a, "sq", "first", blockers)
    assert gates["blocker"].started.wait(10)
    worker.run(worker.a, "sq", "queued", blockers)  # waits behind "first"
    assert set(worker.seal._held) == {("sq", "first"), ("sq", "queued")}
    worker.jobs.handle(Abort("sq", "queued", ErrorInfo("RemoteError", "aborted")))
    gates["blocker"].open.set()
    wait_until(lambda: not worker.seal._held, what="every held sealer let go")
    assert not worker.seal._held_recipients.by_driver


def test_the_held_recipients_stay_bounded_per_driver() -> None:
    """Finding 1's bound: each driver's held jobs at most _HELD (its oldest goes), another
    driver's untouched; a job released or forgotten lets its go."""
    a, b, node = _sealers()
    seal = WorkerSeal(node, 0)

    def opened(driver: Sealer, session: str, job: str) -> None:
        msg = Exec(session, job, "d", (0,), {}, (0,), 5.0)
        context = exec_context(session, job, "d", (0,), (0,), 5.0)
        assert seal.open_exec(msg, job, driver.seal(None, _NODE, context, safe=False)) is None

    opened(a, "sa", "a0")
    assert seal.hold("sa", "a0") == "driver:a"
    for i in range(_HELD + 5):
        opened(b, "sb", f"b{i}")
        assert seal.hold("sb", f"b{i}") == "driver:b"
    assert seal.recipient("sa", "a0") == "driver:a"  # a's, however many of b's
    assert seal.recipient("sb", "b0") == ""  # b's oldest, past b's bound
    assert len(seal._held) == _HELD + 1
    seal.release("sa", "a0")
    seal.forget("sb", f"b{_HELD + 4}")
    assert len(seal._held) == _HELD - 1 and set(seal._held_recipients.by_driver) == {"driver:b"}


def _frame(msg: Exec) -> bytes:
    return b"".join(bytes(f) for f in encode(msg))


def test_an_intruders_repeat_execs_in_a_session_not_its_own_are_refused(
    make_cluster: Any,
) -> None:
    """Found sound. The broker's loop reads a sender's repeat Exec of one frame by
    comparison (``RepeatExecs.repeat_frame``) and hands it to ``exec_read`` itself: an
    intruder's repeats naming the owner's session and program, sent from a raw socket, are
    read that way (counted) and refused as the full read's are; the owner's session is
    untouched."""
    cluster = make_cluster("inproc")
    owner = cluster.client()
    sid = owner.open_session("private").session
    b = GraphBuilder(2)
    graph = b.build([b.op("constant", [], ranks=(1,), value=[4, 2])[0]])
    job = owner.submit(sid, graph, {}).job
    sock = cluster.impl.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, b"intruder")
    try:
        sock.connect(cluster.address)
        for i in range(4):  # the same header but for the job id: 3 repeats
            sock.send(_frame(Exec(sid, f"x{i:07d}", graph.digest, (0, 1), {}, (1,), 5.0)))
        answers: list[Record] = []
        while len(answers) < 4:
            assert sock.poll(20000), f"{len(answers)} of 4 answers"
            answer = from_wire(sock.recv_multipart(copy=False))
            inner = split_batch(answer) if is_batch(answer) else [answer]
            answers += [decode(one, unpickle=False) for one in inner]
        assert all("SessionAccessError" in repr(a) for a in answers), answers
        assert cluster.impl.broker._exec_readers[b"intruder"].repeats == 3
    finally:
        sock.close(linger=0)
    assert owner.fetch(sid, 1, output_uri(job, 0)) == [4, 2]
    assert {s["name"] for s in owner.status()["sessions"]} == {"private"}


def _secure_done(job: str, rank: int, box: bytes, stats: bytes, index: int = 0) -> bytes:
    frames = encode(Done("s" * 34, job, rank, {index: box}, stats, {index: "int"}))
    assert len(frames) == 2
    return b"".join(bytes(f) for f in frames)


def _fields(read: Any) -> tuple[Any, ...]:
    return (read.session, read.job, read.rank, dict(read.values), read.stats)


def test_a_secure_done_stream_is_read_as_the_full_read_reads_it() -> None:
    """Found sound. One sender's stream of Dones (in secure mode each value a new box)
    through one ``RepeatDones(boxes=True)``, as the broker's loop feeds it: repeats, boxes
    of another rank, length, index, layout, and random byte changes, interleaved. Every
    Done read by comparison reads exactly as the full read reads the same bytes."""
    rng = random.Random(3030)
    reader = RepeatDones(boxes=True)
    compared = 0
    for i in range(6000):
        box = rng.randbytes(rng.choice((59, 59, 59, 60, 300)))
        rank = rng.choice((1, 1, 1, 2))
        index = rng.choice((0, 0, 0, 1))
        one = _secure_done(f"j{i:016d}", rank, box, rng.randbytes(24), index)
        if rng.random() < 0.3:
            one = mutated(one, rng)
        got = reader.repeat(one)
        full = read_done_header(one[4:]) if one[:4] == MAGIC_FRAME else None
        if got is None:
            if full is not None and one.startswith(MAGIC_FRAME + DONE_PREFIX):
                reader.keep(one, full)
            continue
        compared += 1
        assert full is not None, f"a repeat the full read refuses: {one!r}"
        assert _fields(got) == _fields(full) and got.metas == full.metas, one
        assert got.saved == full.saved == []
    assert compared > 300  # (589 seen)


def test_a_refused_replay_of_a_running_jobs_exec_keeps_its_recipient() -> None:
    """Finding 2 (low: a denial of service by the broker alone, which could drop the
    Done anyway; w30-worker's hold is undone the same way). a's job runs on the pool, its
    recipient held. The broker sends a's sealed Exec of that job again: the replay guard
    refuses it with a Failed for (session, job), and ``outbound`` of that Failed calls
    ``forget``, which clears the job's booked recipient and releases the held one: its
    Done failed "no authenticated driver here to seal its results for". Fixed: a refusal
    of an Exec that did not open forgets nothing (``open_exec``, which ``inbound`` calls
    too, keeps the Failed it made by identity; ``outbound`` forgets the job of any other
    Failed: a run's)."""
    a, _, node = _sealers()
    seal = WorkerSeal(node, 0)
    msg = Exec("sa", "victim", "d", (0,), {}, (0,), 5.0)
    context = exec_context("sa", "victim", "d", (0,), (0,), 5.0)
    sealed = a.seal(None, _NODE, context, safe=False)
    assert seal.open_exec(msg, "victim", sealed) is None
    assert seal.hold("sa", "victim") == "driver:a"  # handed to the pool
    refusal = seal.open_exec(msg, "victim", sealed)  # the broker's replay
    assert type(refusal) is Failed and "replay" in refusal.error.message
    assert type(seal.outbound(refusal)) is Failed  # the worker answers it
    done = seal.outbound(Done("sa", "victim", 0, {0: 5}))
    assert type(done) is Done, f"a's job's answer: {done!r}"
