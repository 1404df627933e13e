"""Review w30 of this round's speed changes (w30-broker, w30-worker), for soundness: what
the fast reading of a message accepts against what the full read accepts, whose message it
is taken for, what it keeps, and what a hostile party can make it do.

Each finding is a test that fails while the attack works: passing where fixed on this
branch, else a strict xfail that says the fix. The rest checks what was found sound, where
the round's own tests did not already (a hostile sender's bytes through the broker's loop).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_until
from test_session_driver_binding import _sealers

from mpl.wire import GraphBuilder
from mpl.wire.control import Welcome, WorkerHello
from mpl.wire.jobs import Done, Exec, Program
from mpl.wire.record import Record
from mpl.wire.seal import Sealer, exec_context
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.sealing import _HELD, WorkerSeal
from mpl.worker.state import WorkerState
from mpl.worker.store import ObjectStore

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


@pytest.fixture
def gates() -> Iterator[dict[str, _Gate]]:
    _GATES.clear()
    _GATES.update((name, _Gate()) for name in ("victim", "blocker"))
    yield _GATES
    for gate in _GATES.values():  # no job thread is left waiting
        gate.open.set()


class _TwoDrivers:
    """Rank 0's seal and job shell (two job threads), wired as the daemon wires them, with
    two listed drivers a and b; answers sealed as the result channel seals them."""

    def __init__(self) -> None:
        self.a, self.b, node = _sealers()
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
            job_threads=2,
        )

    def program(self, call: Any) -> str:
        b = GraphBuilder(1)
        graph = b.build(b.op("pcall", [], ranks=(0,), fn=b.fn(call)))
        self.jobs.handle(Program(graph.digest, graph))
        return graph.digest

    def run(self, driver: Sealer, session: str, job: str, digest: str) -> None:
        """``driver``'s sealed job, opened by the seal and handed to the job shell, as the
        worker's broker_messages does."""
        msg = Exec(session, job, digest, (0,), {}, (0,), 60.0)
        context = exec_context(session, job, digest, (0,), (0,), 60.0)
        assert self.seal.open_exec(msg, job, driver.seal(None, _NODE, context, safe=False)) is None
        assert not self.jobs.handle(msg)

    def answer(self, job: str) -> Record:
        found: Record = wait_until(
            lambda: next((m for m in self.posted if getattr(m, "job", "") == job), None),
            what=f"{job}'s answer",
        )
        return found


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
