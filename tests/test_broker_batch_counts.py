"""What the broker does per job with many jobs in flight, counted: its Python calls when a
driver's Execs and a worker's Dones arrive in batches (``mpl.wire.batch``), as they do at
64 jobs in flight, through its own receive loop and sends (never timed).

With jobs in flight the broker is the process every job passes through twice, and the one
that saturates first on 2 cores: what it does per message inside a batch is its cost.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import zmq
from hand_turned_broker import HandTurnedBroker, turned_frames

from mpl.wire.batch import batch_frames, is_batch, split_batch
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, decode, encode, from_wire, to_wire
from mpl.wire.jobs import Done, Exec, JobResult
from mpl.wire.run_stats import pack_stats

STATS = pack_stats(1.2e-05, 1.7645e9, [[0, "pcall", 1e-06, 1.1e-05]])
_IN_A_BATCH = 16  # what the broker sends a peer per wake-up, at most (daemon._WAKE)


class _BatchedShell(HandTurnedBroker):
    """A real ``Broker`` on inproc, its loop turned by hand, between a DEALER driver that
    sends its Execs in batches and a DEALER worker (rank 0 of 2) that answers each batch of
    Execs with a batch of Dones."""

    def __init__(self) -> None:
        # (inproc: what was sent is queued, a turn need not wait)
        super().__init__(
            ClusterSpec.simple(2), "inproc://batch-counts", "batch", ranks=(0,), rcvtimeo=0
        )

    def _frames(self, sock: zmq.Socket[Any], count: Any = None) -> list[bytes]:
        return turned_frames(self.broker, sock, count=count)

    def batch(self, count: Any) -> None:
        """_IN_A_BATCH trivial jobs on rank 0: their Execs in one batch, their Dones in one,
        their answers checked; the broker's turns counted by ``count``."""
        names = [f"j{self.jobs + i:023d}" for i in range(_IN_A_BATCH)]
        self.jobs += _IN_A_BATCH
        execs = [encode(Exec(self.sid, n, self.graph.digest, (0,), {}, (0,), 600)) for n in names]
        self.driver.send_multipart(to_wire(batch_frames([h for _, h in execs])))
        assert self._execs(count) == names
        dones = [encode(Done(self.sid, n, 0, {0: 1}, STATS, {0: "int64[]"})) for n in names]
        self.workers[0].send_multipart(to_wire(batch_frames([h for _, h in dones])))
        answer = from_wire(self._frames(self.driver, count))
        assert is_batch(answer)
        results = [decode(inner) for inner in split_batch(answer)]
        assert all(isinstance(r, JobResult) for r in results)
        assert [(r.job, r.error, r.values) for r in results] == [  # type: ignore[attr-defined]
            (n, None, {0: {0: 1}}) for n in names
        ]

    def _execs(self, count: Any) -> list[str]:
        """The jobs of the Execs the worker gets next, _IN_A_BATCH of them, in order."""
        got: list[str] = []
        while len(got) < _IN_A_BATCH:
            frames = from_wire(self._frames(self.workers[0], count))
            inner = split_batch(frames) if is_batch(frames) else [frames]
            msgs = [decode(one, unpickle=False) for one in inner]
            got += [m.job for m in msgs if type(m) is Exec]  # (its welcome, a program)
        return got

    def hold(self) -> None:
        """_IN_A_BATCH jobs sent and never answered: from now on jobs are in flight, as
        at 64 in flight (a job alone in flight goes out at once, in no batch)."""
        names = [f"held{i:020d}" for i in range(_IN_A_BATCH)]
        execs = [encode(Exec(self.sid, n, self.graph.digest, (0,), {}, (0,), 600)) for n in names]
        self.driver.send_multipart(to_wire(batch_frames([h for _, h in execs])))
        assert self._execs(None) == names


@pytest.fixture
def shell() -> Any:
    with contextlib.closing(_BatchedShell()) as made:
        made.hold()
        yield made


def _calls_per_job(shell: _BatchedShell, batches: int = 8) -> float:
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event == "call"

    for _ in range(3):  # warm: first uses, caches
        shell.batch(None)
    for _ in range(batches):
        shell.batch(count)
    return calls / (batches * _IN_A_BATCH)


# 2357d5f made 39 (each inner message through _handle and read_hot's two calls, split
# with a bin_bounds call per header, coalesced with a header_only call per message);
# w28flight: a batch's Dones read and handed to the state in _batch itself, its bin8 heads
# read inline, coalesce's header check written out (39 -> 29); _exec's answer a method, not
# a closure made per job, its ranks checked inline (29 -> 28); the ledger's spans filled in
# without __init__, a batch's Execs handed to the state in _batch itself (-> 26).
_BOUND = 27  # a call over: another file's cache may add a fraction


def test_python_calls_per_job_when_execs_and_dones_come_in_batches(
    shell: _BatchedShell,
) -> None:
    """A trivial job whose Exec and Done ride in batches of 16 (64 jobs in flight) makes
    at most this many Python calls at the broker, its receives and sends included."""
    per_job = _calls_per_job(shell)
    print(f"{per_job} Python calls per job in batches of {_IN_A_BATCH}")
    assert per_job <= _BOUND


def test_a_repeat_exec_is_read_by_comparison_and_a_changed_one_in_full(
    shell: _BatchedShell,
) -> None:
    """A driver's Execs of one program differ in their job ids alone: after the first, the
    broker reads each by comparing it with its sender's last (``mpl.wire.exec_repeat``), not
    with msgpack; one that differs elsewhere is read in full, and answered as it would be
    alone."""
    full_reads = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal full_reads
        full_reads += event == "call" and frame.f_code.co_name == "_read_exec"

    shell.batch(None)
    for _ in range(4):
        shell.batch(count)
    assert full_reads == 0  # 2357d5f: one per Exec (64)
    # the same header but for its ranks: (0, 0) names a rank twice
    bad = Exec(shell.sid, "j" + "x" * 22, shell.graph.digest, (0, 0), {}, (0,), 600)
    shell.driver.send_multipart(to_wire(encode(bad)))
    answer = decode(from_wire(shell._frames(shell.driver, count)), unpickle=False)
    assert isinstance(answer, JobResult) and answer.job == bad.job
    assert answer.error is not None and "names a rank twice" in answer.error.message
    assert full_reads == 1


def test_the_answers_of_a_batch_read_the_clocks_once_for_the_ledger(
    shell: _BatchedShell,
) -> None:
    """The ledger ends the jobs answered in one batch at one reading of its clock and the
    wall clock (they went out together), not two readings per job."""
    clocks = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal clocks
        clocks += event == "c_call" and arg.__name__ in ("monotonic", "time")

    shell.batch(None)
    for _ in range(4):
        shell.batch(count)
    assert shell.broker.ledger.count >= 5 * _IN_A_BATCH
    # the loop's one reading per wake-up, the ledger's two per batch answered; 2357d5f
    # read both per job (2 a job and more)
    print(f"{clocks} clock readings for {4 * _IN_A_BATCH} jobs")
    assert clocks / (4 * _IN_A_BATCH) <= 0.5


def test_the_exec_readers_kept_per_sender_are_bounded(
    shell: _BatchedShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader per sender of Execs (to read its next one by comparison): a peer with many
    connections (routing ids) cannot grow the table past its bound, and every reader reads
    what the full reader reads."""
    from mpl.broker import inbox
    from mpl.wire.hot import read_hot

    monkeypatch.setattr(inbox, "_EXEC_READERS", 3)
    broker = shell.broker
    for n in range(8):
        header = encode(Exec(shell.sid, f"j{n:04d}", shell.graph.digest, (0,), {}, (0,), 9))[1]
        for peer in (b"drv:a/%d" % n, b"drv:b/%d" % n):
            got = broker._exec_of(peer, header)
            assert got is not None and got.__dict__ == read_hot([MAGIC_FRAME, header]).__dict__
        assert len(broker._exec_readers) <= 3
