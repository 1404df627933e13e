"""Review of w32's trust changes: the broker's memory of ended jobs for their late Dones.

A job that ends (fails, is cancelled) while ranks have yet to answer is kept (session,
driver, ranks) so that a save a late ``Done`` of one of those ranks reports is listed to
that driver (``broker/job_saves.py``). Each rank answers a job once: only a rank the job
still waited for when it ended may report for it late, once. A rank that had answered, or
a second late Done of one that has, is a worker speaking for a job it has no more part in:
what it reports is kept as no one's (as before the memory), and an entry whose ranks have
all answered is dropped. Entries are keyed by session and job, so one session's job never
takes the place of another's of the same id.
"""

from __future__ import annotations

from test_red31b_persisted_names import ALICE, BOB, W, _desc, _listed, _open, _secure

from mpl.broker.job_saves import ENDED_JOBS_KEPT
from mpl.broker.state import BrokerState
from mpl.wire import GraphBuilder
from mpl.wire.codec import decode, encode
from mpl.wire.hot import read_done
from mpl.wire.jobs import Done, Exec, Failed, JobResult, Program
from mpl.wire.remote import ErrorInfo


def _ended_job(state: BrokerState, who: str, job: str, answered: tuple[int, ...]) -> str:
    """``who``'s job ``job`` on ranks 0, 1 and 2 that fails on rank 1 after the ranks
    ``answered`` sent their Done; its session's id."""
    peer = who.encode()
    sid = _open(state, who)
    b = GraphBuilder(3)
    b.op("constant", [], ranks=(0, 1, 2), value=1)
    graph = b.build([])
    program = decode(encode(Program(graph.digest, graph)), unpickle=False)
    assert isinstance(program, Program)
    state.handle(peer, program, 0.1, who=who)
    state.handle(peer, Exec(sid, job, program.digest, (0, 1, 2), {}), 0.2, who=who)
    for rank in answered:
        state.handle(W[rank], Done(sid, job, rank), 0.25, who=f"node:node{rank}")
    failed = Failed(sid, job, 1, ErrorInfo("RemoteError", "boom", rank=1))
    out = state.handle(W[1], failed, 0.3, who="node:node1")
    assert [type(a.msg) for a in out if isinstance(a.msg, JobResult)] == [JobResult]
    return sid


def _late(state: BrokerState, sid: str, job: str, rank: int, name: str) -> None:
    done = Done(sid, job, rank, saved=[_desc(name, f"P{rank}", (rank,))])
    state.handle(W[rank], done, 0.4, who=f"node:node{rank}")


def test_a_rank_that_had_answered_saves_nothing_for_the_driver_late() -> None:
    """Rank 0 answered alice's job before it failed on rank 1; a Done of rank 0 after the
    failure is no answer the job waited for: its save is listed to no one."""
    state = _secure()
    sid = _ended_job(state, ALICE, "j", answered=(0,))
    _late(state, sid, "j", 0, "forged")
    assert _listed(state, ALICE) == []
    _late(state, sid, "j", 2, "late")  # rank 2's own late answer stands
    assert _listed(state, ALICE) == [("late", 2)]


def test_a_rank_answers_an_ended_job_once() -> None:
    state = _secure()
    sid = _ended_job(state, ALICE, "j", answered=())
    _late(state, sid, "j", 2, "first")
    _late(state, sid, "j", 2, "again")  # a second late Done of rank 2: no one's
    assert _listed(state, ALICE) == [("first", 2)]
    _late(state, sid, "j", 0, "zero")
    assert _listed(state, ALICE) == [("first", 2), ("zero", 0)]
    assert len(state.job_saves.ended) == 0  # every rank it waited for answered: dropped


def test_a_late_done_without_saves_is_its_ranks_answer_too() -> None:
    """A late Done that saved nothing (read by the hot reader, or decoded) still answers
    for its rank: a later one of that rank saves for no one."""
    state = _secure()
    sid = _ended_job(state, ALICE, "j", answered=())
    read = read_done(encode(Done(sid, "j", 2)))
    assert read is not None
    state.dones.read(W[2], read, 0.35, "node:node2")  # the hot path's
    state.handle(W[0], Done(sid, "j", 0), 0.35, who="node:node0")  # decoded
    _late(state, sid, "j", 2, "two")
    _late(state, sid, "j", 0, "zero")
    assert _listed(state, ALICE) == []
    assert len(state.job_saves.ended) == 0


def test_another_sessions_job_of_the_same_id_takes_no_ones_place() -> None:
    """Bob's job of the same id ending after alice's keeps alice's entry: her late Done
    still saves for her (job ids are drawn at random by honest drivers; a driver may send
    any)."""
    state = _secure()
    alice_sid = _ended_job(state, ALICE, "j", answered=())
    bob_sid = _ended_job(state, BOB, "j", answered=())
    _late(state, alice_sid, "j", 2, "hers")
    _late(state, bob_sid, "j", 0, "his")
    assert _listed(state, ALICE) == [("hers", 2)]
    assert _listed(state, BOB) == [("his", 0)]


def test_the_memory_is_bounded_and_keeps_only_jobs_with_ranks_to_answer() -> None:
    state = _secure()
    peer = ALICE.encode()
    sid = _ended_job(state, ALICE, "j", answered=())
    digest = state.programs.items()[0][0][1]  # the program _ended_job sent
    for k in range(ENDED_JOBS_KEPT + 10):
        state.handle(peer, Exec(sid, f"k{k}", digest, (0, 1, 2), {}), 0.5, who=ALICE)
        failed = Failed(sid, f"k{k}", 1, ErrorInfo("RemoteError", "boom", rank=1))
        state.handle(W[1], failed, 0.5, who="node:node1")
    assert len(state.job_saves.ended) == ENDED_JOBS_KEPT
    _late(state, sid, "j", 2, "evicted")  # the oldest went: its late save is no one's
    assert _listed(state, ALICE) == []
    # a job that ends with no rank left to answer (its last Done failed it) keeps nothing
    state.handle(peer, Exec(sid, "c", digest, (0,), {}), 0.6, who=ALICE)
    state.handle(
        W[0], Failed(sid, "c", 0, ErrorInfo("RemoteError", "x", rank=0)), 0.6, who="node:node0"
    )
    assert all(key[1] != "c" for key in state.job_saves.ended)
