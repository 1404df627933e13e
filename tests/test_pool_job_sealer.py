"""A job the job pool holds keeps its sealer however many sealed jobs open meanwhile.

A secure worker remembers who sealed each job it opened (``WorkerSeal``): the job's moves
carry that driver, and only moves carrying it reach the job (``tests/test_move_sealer.py``);
its ``Done`` is sealed for that driver. The seal remembers the last 4,096 jobs opened. A
job handed to the job pool, queued behind other work or running long, used to be
forgotten once 4,096 other jobs opened meanwhile: a queued one then started with no
sealer (its moves waited until their deadline), a running one finished with no recipient
for its ``Done`` (it failed). The seal now holds the driver of each job the pool holds,
until the pool is done with it; what it holds stays bounded.

The seal and the job shell are the worker's own, wired as the daemon wires them; the
Execs are a driver's sealed ones, fed to the seal as the broker hands them on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from helpers import sealer_pair, wait_until

from mpl.wire import GraphBuilder
from mpl.wire.control import Welcome, WorkerHello
from mpl.wire.jobs import Done, Exec, Program
from mpl.wire.record import Record
from mpl.wire.seal import Sealer, exec_context
from mpl.worker.held_recipients import HELD_PER_DRIVER as _HELD
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.sealing import _MEMORY, WorkerSeal
from mpl.worker.session_pool import owner_share
from mpl.worker.state import WorkerState
from mpl.worker.store import ObjectStore

_NODE = "node:n0"


class _Gated:
    """A job's one call, which waits until the test opens its gate."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()

    def __call__(self) -> int:
        self.started.set()
        self.gate.wait(30)
        return 7


class SealedShell:
    """Rank 0's seal (``node``'s) and job shell, wired as the daemon wires them, its
    answers sealed by the seal as the daemon's result channel seals them."""

    def __init__(self, node: Sealer, threads: int = 1) -> None:
        self.seal = WorkerSeal(node, 0)
        state = WorkerState(WorkerHello(0, "inc", 1, "h", "tcp://d", "", []), now=0.0)
        state.handle(Welcome(0, 1, "B1", 1.0, {}), 0.0)
        self.posted: list[Record] = []
        self.jobs = Jobs(
            state,
            ObjectStore(),
            move_mailbox(),
            None,  # type: ignore[arg-type]  # (no moves: one rank)
            lambda msg: self.posted.append(self.seal.outbound(msg)),
            sealers=self.seal,
            job_threads=threads,
        )

    def program(self, call: Callable[[], Any]) -> str:
        """A program of one call on rank 0, its output sent back inline: its digest."""
        b = GraphBuilder(1)
        graph = b.build(b.op("pcall", [], ranks=(0,), fn=b.fn(call)))
        self.jobs.handle(Program(graph.digest, graph))
        return graph.digest

    def answer(self, job: str) -> Record:
        """The answer posted for ``job`` (waits for it)."""
        answer: Record = wait_until(
            lambda: next((m for m in self.posted if getattr(m, "job", "") == job), None),
            what=f"{job}'s answer",
        )
        return answer


class _Worker(SealedShell):
    """A shell whose one driver is a (one job thread unless said)."""

    def __init__(self, threads: int = 1) -> None:
        self.driver, node = sealer_pair("driver:a", _NODE)
        super().__init__(node, threads)

    def opened(self, session: str, job: str, digest: str) -> Exec:
        """The driver's job ``job`` of ``digest``, opened by the seal (no inputs)."""
        msg = Exec(session, job, digest, (0,), {}, (0,), 60.0)
        sealed = self.driver.seal(
            None, _NODE, exec_context(session, job, digest, (0,), (0,), 60.0), safe=False
        )
        assert self.seal.open_exec(msg, job, sealed) is None  # admitted
        return msg

    def others_opened(self, count: int) -> None:
        """``count`` more jobs of the driver's opened by the seal (not run)."""
        msg = Exec("busy", "x", "d", (0,), {}, (), 60.0)
        for i in range(count):
            job = f"other{i}"
            context = exec_context("busy", job, "d", (0,), (), 60.0)
            sealed = self.driver.seal(None, _NODE, context, safe=False)
            assert self.seal.open_exec(msg, job, sealed) is None

    def run(self, session: str, job: str, digest: str) -> None:
        """Open the job and hand it to the job shell: its program's first run, on the pool."""
        assert not self.jobs.handle(self.opened(session, job, digest))

    def running_sealer(self, session: str, job: str) -> str:
        """The sealer the running job's context carries (what its moves carry)."""
        run = wait_until(lambda: self.jobs._runs.get((session, job)), what=f"{job} to run")
        return str(run.sealer)


# the gates of the calls below, by name (a program's functions go by reference, not
# pickled with their locks)
_GATES: dict[str, _Gated] = {}


def _long() -> int:
    return _GATES["long"]()


def _first() -> int:
    return _GATES["first"]()


def _queued() -> int:
    return _GATES["queued"]()


@pytest.fixture
def gates() -> Iterator[dict[str, _Gated]]:
    _GATES.clear()
    _GATES.update((name, _Gated()) for name in ("long", "first", "queued"))
    yield _GATES
    for gated in _GATES.values():  # no job thread is left waiting
        gated.gate.set()


def _opened_value(driver: Sealer, done: Record) -> Any:
    assert type(done) is Done, f"the job's answer is {done!r}"
    _, value = driver.open(done.values[0], f"done|{done.session}|{done.job}|0", safe=True)
    return value


def test_a_running_pooled_job_keeps_its_recipient_while_many_jobs_open(
    gates: dict[str, _Gated],
) -> None:
    worker = _Worker()
    long = gates["long"]
    worker.run("s", "long", worker.program(_long))
    assert long.started.wait(10)
    assert worker.running_sealer("s", "long") == "driver:a"
    worker.others_opened(_MEMORY + 10)
    long.gate.set()
    # its Done sealed for its driver, not refused for want of one
    assert _opened_value(worker.driver, worker.answer("long")) == 7
    wait_until(lambda: not worker.seal._held, what="the job's sealer let go")


def test_a_queued_pooled_job_starts_with_its_sealer_after_many_jobs_open(
    gates: dict[str, _Gated],
) -> None:
    worker = _Worker(threads=1)
    first, queued = gates["first"], gates["queued"]
    worker.run("s1", "first", worker.program(_first))  # the one job thread, held
    assert first.started.wait(10)
    worker.run("s2", "queued", worker.program(_queued))  # waits for it
    worker.others_opened(_MEMORY + 10)
    first.gate.set()
    assert queued.started.wait(10)
    # what its moves would carry: its driver, so that its peers' moves reach it
    assert worker.running_sealer("s2", "queued") == "driver:a"
    queued.gate.set()
    assert _opened_value(worker.driver, worker.answer("queued")) == 7
    assert _opened_value(worker.driver, worker.answer("first")) == 7
    wait_until(lambda: not worker.seal._held, what="the jobs' sealers let go")


def test_the_sealers_held_stay_bounded_and_a_forgotten_job_lets_its_go() -> None:
    worker = _Worker()
    for i in range(_HELD + 5):
        worker.opened("s", f"j{i}", "d")
        assert worker.seal.hold("s", f"j{i}") == "driver:a"
    assert len(worker.seal._held) == _HELD
    assert worker.seal.recipient("s", "j0") == ""  # the oldest gone, past the bound
    last = f"j{_HELD + 4}"
    worker.seal.forget("s", last)  # failed or aborted: no recipient any more
    assert worker.seal.recipient("s", last) == "" and len(worker.seal._held) == _HELD - 1
    assert worker.seal.hold("s", "never-opened") == ""  # nothing held for it
    worker.seal.release("s", f"j{_HELD}")
    assert len(worker.seal._held) == _HELD - 2


def _quick() -> int:
    return 7


def test_one_drivers_held_jobs_leave_another_driver_threads(gates: dict[str, _Gated]) -> None:
    """R33-5 in secure mode: the pool is shared out by the key that sealed each job, so a
    driver whose jobs hold threads (here a gate; a move a party never sends, in the attack)
    gets its share, and another driver's job still finds one."""
    a_keys, b_keys, n_keys = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    drivers = {"driver:a": a_keys[0].decode(), "driver:b": b_keys[0].decode()}
    node = Sealer(n_keys[1].decode(), _NODE, drivers)
    worker = SealedShell(node, threads=4)
    share = owner_share(4)
    assert share == 3
    sealed_by = {
        name: Sealer(keys[1].decode(), name, {_NODE: n_keys[0].decode()})
        for name, keys in (("driver:a", a_keys), ("driver:b", b_keys))
    }

    def run(driver: str, session: str, job: str, digest: str) -> None:
        msg = Exec(session, job, digest, (0,), {}, (0,), 60.0)
        context = exec_context(session, job, digest, (0,), (0,), 60.0)
        sealed = sealed_by[driver].seal(None, _NODE, context, safe=False)
        assert worker.seal.open_exec(msg, job, sealed) is None  # admitted
        assert not worker.jobs.handle(msg)

    held = worker.program(_long)
    for n in range(share + 1):  # one session each: a session's jobs run one at a time
        run("driver:a", f"a{n}", f"held{n}", held)
    wait_until(lambda: len(worker.jobs._runs) == share, what="driver a's share to run")
    run("driver:b", "b", "quick", worker.program(_quick))
    assert _opened_value(sealed_by["driver:b"], worker.answer("quick")) == 7
    assert len(worker.jobs._runs) == share  # driver a's last job parked, not on a thread
    assert worker.jobs._pool.held() == {"driver:a": share}
    gates["long"].gate.set()
    for n in range(share + 1):
        assert _opened_value(sealed_by["driver:a"], worker.answer(f"held{n}")) == 7
