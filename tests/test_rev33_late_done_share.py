"""Late-Done memory, each driver its share (w32's closing note, left over).

The broker remembers the driver of jobs that ended with ranks still to answer, so that a
late ``Done``'s saves are listed to that driver. It kept the last 4,096 over all drivers:
bob failing 4,096 jobs of his own (a program that raises does it) pushed alice's entry
out, and her late save was then listed to no one. Now a full memory pushes out the oldest
entry of the driver holding the most (``broker/ended_jobs.py``).

Through the broker's real state machine, each message from its authenticated sender.
"""

from __future__ import annotations

from test_red31b_persisted_names import ALICE, BOB, W, _listed, _secure
from test_rev32_late_saves import _ended_job, _late

from mpl.broker.ended_jobs import ENDED_JOBS_KEPT, EndedJobs
from mpl.broker.state import BrokerState
from mpl.wire.jobs import Exec, Failed
from mpl.wire.remote import ErrorInfo


def _fail_many(state: BrokerState, who: str, sid: str, count: int) -> None:
    """``who`` sends ``count`` jobs of the program it sent; rank 1 fails each, ranks 0
    and 2 still owing their answers."""
    digest = state.programs.items()[0][0][1]
    for k in range(count):
        state.handle(who.encode(), Exec(sid, f"{who}{k}", digest, (0, 1, 2), {}), 0.5, who=who)
        failed = Failed(sid, f"{who}{k}", 1, ErrorInfo("RemoteError", "boom", rank=1))
        state.handle(W[1], failed, 0.5, who="node:node1")


def test_one_drivers_failures_do_not_push_out_anothers_ended_job() -> None:
    state = _secure()
    alice_sid = _ended_job(state, ALICE, "hers", answered=())
    bob_sid = _ended_job(state, BOB, "first", answered=())
    _fail_many(state, BOB, bob_sid, ENDED_JOBS_KEPT + 10)
    assert len(state.job_saves.ended) == ENDED_JOBS_KEPT
    _late(state, alice_sid, "hers", 2, "late")
    assert _listed(state, ALICE) == [("late", 2)]  # still hers
    _late(state, bob_sid, "first", 0, "his")  # bob's oldest went: his own
    assert _listed(state, BOB) == []


def test_the_memory_is_shared_out_evenly_when_full() -> None:
    """Entries go from whoever holds the most: two drivers filling it end with half each,
    and one holding less than half keeps all of its own."""
    ended = EndedJobs(limit=10)
    for k in range(3):
        ended[("s", f"a{k}")] = ("driver:a", (0, 1), {1})
    for k in range(50):
        ended[("s", f"b{k}")] = ("driver:b", (0, 1), {1})
    assert (ended.held_by("driver:a"), ended.held_by("driver:b"), len(ended)) == (3, 7, 10)
    assert all(("s", f"a{k}") in ended for k in range(3))
    assert [k for k in ended if k[1].startswith("b")] == [("s", f"b{k}") for k in range(43, 50)]
    for k in range(50):
        ended[("s", f"c{k}")] = ("driver:c", (0, 1), {1})
    assert sorted(ended.held_by(d) for d in ("driver:a", "driver:b", "driver:c")) == [3, 3, 4]
    for key in list(ended):
        del ended[key]
    assert len(ended) == 0 and ended.held_by("driver:c") == 0
    ended[("s", "again")] = ("driver:a", (0,), {0})
    ended[("s", "again")] = ("driver:b", (0,), {0})  # the same key again: replaced
    assert (len(ended), ended.held_by("driver:a"), ended.held_by("driver:b")) == (1, 0, 1)
