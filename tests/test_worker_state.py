"""The worker's state machine (worker/state.py) driven by hand: no sockets, an explicit
clock. Abort of running and queued jobs, session close, worker and broker restarts, SPU
failure counting, timers. The last tests run the job shell over the state with a real
mailbox and store (threads, still no sockets) to see waits woken and values freed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import wait_until

from mpl.wire.control import Reregister, Welcome, WorkerHello
from mpl.wire.errors import JobAbortedError
from mpl.wire.graph import Graph, GraphBuilder, Op
from mpl.wire.jobs import Abort, Done, Exec, Failed, Program
from mpl.wire.progress import Progress
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SessionClosed, SymbolInfo
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.state import WorkerState
from mpl.worker.state_events import (
    Beat,
    CloseAll,
    CloseSession,
    CodeRefused,
    DropLanes,
    EndJob,
    Expect,
    FreeJob,
    Joined,
    Post,
    Reconnect,
    Run,
    RunAborted,
    RunFailed,
    RunFinished,
    Send,
    StopWaits,
    Submit,
    Tick,
)
from mpl.worker.store import ObjectStore

RANK = 0


def _graph(*opcodes: str, name: str = "g") -> Graph:
    ops = tuple(Op(code, (), 0, (0, 1)) for code in opcodes)
    return Graph(2, (), ops, (), name=name)


LOCAL = _graph("pcall", name="local")
MOVING = _graph("pcall", "move", name="moving")
SPU = _graph("spu.run", name="spu")


def _state(symbols: list[SymbolInfo] | None = None) -> WorkerState:
    hello = WorkerHello(RANK, "inc", 1, "h", "tcp://d", "", symbols or [])
    state = WorkerState(hello, now=0.0, heartbeat_s=1.0)
    state.handle(Welcome(RANK, 2, "B1", 1.0, {}), 0.0)
    for graph in (LOCAL, MOVING, SPU):
        state.handle(Program(graph.digest, graph), 0.0)
    return state


def _exec(sid: str, job: str, graph: Graph = MOVING) -> Exec:
    return Exec(sid, job, graph.digest, (0, 1), {})


def _done(sid: str, job: str) -> RunFinished:
    return RunFinished(sid, job, 0.01, Done(sid, job, RANK))


def _of(actions: list[Any], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def _abort(sid: str, job: str, why: str = "rank 1 failed") -> Abort:
    return Abort(sid, job, ErrorInfo("RemoteError", why))


# -- abort --------------------------------------------------------------------------------
def test_an_aborted_running_job_wakes_its_waits_frees_its_values_and_says_nothing() -> None:
    s = _state()
    out = s.handle(_exec("s", "j"), 1.0)
    assert out[0] == Expect(("s", "j")) and out[1] == Run(_exec("s", "j"), MOVING, inline=False)
    out = s.handle(_abort("s", "j"), 1.1)
    assert _of(out, StopWaits) == [StopWaits(("s", "j"), "job j aborted: rank 1 failed")]
    assert _of(out, FreeJob) == [FreeJob(("s", "j"))]
    assert s.stopped(("s", "j")) == "job j aborted: rank 1 failed"
    out = s.handle(RunAborted("s", "j", 0.2), 1.2)  # the job thread saw the abort
    assert _of(out, Post) == [] and EndJob(("s", "j")) in out and FreeJob(("s", "j")) in out
    assert s.done == 0 and s.failed == 0 and s.queued == {} and s.jobs == {}


def test_a_run_that_finishes_after_its_abort_is_freed_not_reported() -> None:
    s = _state()
    s.handle(_exec("s", "j"), 1.0)
    s.handle(_abort("s", "j"), 1.1)
    out = s.handle(_done("s", "j"), 1.2)  # outputs stored before the thread saw the abort
    assert _of(out, Post) == [] and FreeJob(("s", "j")) in out and s.done == 0


def test_an_aborted_queued_job_never_runs_and_the_next_one_does() -> None:
    s = _state()
    s.handle(_exec("s", "first"), 1.0)
    s.handle(_exec("s", "second"), 1.0)
    s.handle(_exec("s", "third"), 1.0)
    assert s.queued == {"s": 3}
    s.handle(_abort("s", "second"), 1.1)
    assert s.stopped(("s", "second")) and not s.stopped(("s", "third"))
    s.handle(_done("s", "first"), 1.2)
    s.handle(RunAborted("s", "second", 0.0), 1.3)  # its turn came: stopped at once
    out = s.handle(_done("s", "third"), 1.4)
    assert _of(out, Post) == [Post(Done("s", "third", RANK))]
    assert s.done == 2 and s.queued == {}


def test_an_abort_before_its_exec_stops_the_run() -> None:
    s = _state()
    s.handle(_abort("s", "j"), 1.0)  # the broker's abort overtook nothing: it came first
    s.handle(_exec("s", "j"), 1.1)
    assert s.stopped(("s", "j")) is not None


# -- session close ------------------------------------------------------------------------
def test_closing_a_session_stops_its_jobs_frees_it_and_frees_again_after_queued_work() -> None:
    s = _state()
    s.handle(_exec("s", "running"), 1.0)
    s.handle(_exec("other", "k"), 1.0)
    out = s.handle(SessionClosed("s", "the driver left"), 1.1)
    assert _of(out, StopWaits) == [
        StopWaits(("s", "running"), "job running aborted: the driver left")
    ]
    assert _of(out, CloseSession) == [CloseSession("s", "the driver left")]
    # its running job may still store outputs: the store is closed again after it
    assert _of(out, Submit) == [Submit("s", SessionClosed("s", "the driver left"))]
    assert s.stopped(("other", "k")) is None
    assert s.handle(_exec("s", "late"), 1.2) == []  # a job for a closed session: nothing
    assert "session closed" in (s.stopped(("s", "late")) or "")


def test_closing_an_idle_session_needs_no_second_free() -> None:
    s = _state()
    out = s.handle(SessionClosed("s", "bye"), 1.0)
    assert out == [CloseSession("s", "bye")]


# -- restarts -----------------------------------------------------------------------------
def test_a_restarted_worker_registers_its_persisted_names_and_has_no_programs() -> None:
    names = [SymbolInfo("kept", "P0", (0,), True, {})]
    fresh = WorkerState(WorkerHello(RANK, "inc2", 1, "h", "tcp://d", "", names), now=5.0)
    (hello,) = fresh.handle(Tick(), 5.0)
    assert isinstance(hello, Send) and isinstance(hello.msg, WorkerHello)
    assert hello.msg.symbols == names
    out = fresh.handle(_exec("s", "j"), 5.1)  # a program cached before the restart
    (failed,) = _of(out, Post)
    assert isinstance(failed.msg, Failed) and "not cached here" in failed.msg.error.message
    fresh.handle(Program(MOVING.digest, MOVING), 5.2)
    assert _of(fresh.handle(_exec("s", "j2"), 5.3), Run)


def test_reregistration_sends_the_hello_again_at_once() -> None:
    s = _state()
    out: list[Any] = s.handle(Reregister("B1"), 3.0)
    assert _of(out, Send) and isinstance(out[0].msg, WorkerHello)
    assert not s.joined


def test_a_restarted_broker_closes_every_session_a_returning_one_keeps_them() -> None:
    s = _state()
    s.handle(_exec("s", "j"), 1.0)
    s.handle(Reregister("B1"), 2.0)  # the same broker lost us for a while: keep the jobs
    out = s.handle(Welcome(RANK, 2, "B1", 1.0, {}), 2.1)
    assert out == [Joined("B1", False)] and s.stopped(("s", "j")) is None
    assert _of(s.handle(_done("s", "j"), 2.2), Post)  # its answer still goes out
    s.handle(_exec("s", "j2"), 3.0)
    out = s.handle(Welcome(RANK, 2, "B2", 1.0, {}), 4.0)  # a new broker: sessions are gone
    assert out == [CloseAll("the broker restarted"), Joined("B2", True)]
    s.handle(SessionClosed("s", "the broker restarted"), 4.0)  # what the shell does for each
    assert "the broker restarted" in (s.stopped(("s", "j2")) or "")


# -- SPU failures -------------------------------------------------------------------------
def test_spu_failures_are_counted_once_per_job_and_drop_the_lanes() -> None:
    s = _state()
    s.handle(_exec("s", "a", SPU), 1.0)
    out = s.handle(RunFailed("s", "a", 0.1, ErrorInfo("RemoteError", "boom")), 1.1)
    assert DropLanes("s") in out and s.spu_failures == {"s": 1}
    assert DropLanes("s") not in s.handle(_abort("s", "a"), 1.2)  # already counted
    s.handle(_exec("s", "b", SPU), 2.0)
    assert DropLanes("s") in s.handle(_abort("s", "b"), 2.1)  # an abort counts too
    s.handle(RunAborted("s", "b", 0.0), 2.2)
    assert s.spu_failures == {"s": 2}
    s.handle(_exec("s", "c"), 3.0)  # no SPU op: no count, lanes kept
    assert DropLanes("s") not in s.handle(RunFailed("s", "c", 0.1, ErrorInfo("E", "x")), 3.1)
    s.handle(SessionClosed("s", "done"), 4.0)
    assert s.spu_failures == {}


# -- timers and the inline decision ---------------------------------------------------------
def test_heartbeats_and_silence_follow_the_given_clock() -> None:
    s = _state()  # welcomed at 0.0, heartbeat 1 s, liveness 3
    assert s.handle(Tick(), 0.0) == [Beat()]
    assert s.handle(Tick(), 0.5) == []
    assert s.handle(Tick(), 1.0) == [Beat()]
    s.handle(_exec("s", "j"), 2.5)  # any word from the broker counts as life
    assert not _of(s.handle(Tick(), 5.4), Reconnect)
    (reconnect,) = _of(s.handle(Tick(), 5.6), Reconnect)
    assert "for 3.1 s" in reconnect.reason  # the silence, measured before the rejoin
    assert not s.joined


def test_the_timers_are_due_when_the_broker_would_be_silent_too_long() -> None:
    s = _state()  # joined at 0.0, heartbeat 1 s, silent past 3 s
    for now in (0.0, 1.0, 2.0, 3.0):
        assert s.handle(Tick(), now) == [Beat()]
    assert s.next_due() == 3.0  # not the next heartbeat (4.0): a resting loop wakes then
    assert _of(s.handle(Tick(), 3.001), Reconnect)


def test_a_quick_local_program_runs_inline_only_when_its_session_is_idle() -> None:
    s = _state()
    s.inline_s = 0.05
    first = _exec("s", "1", LOCAL)
    assert _of(s.handle(first, 1.0), Run) == [Run(first, LOCAL, inline=False)]
    s.handle(_done("s", "1"), 1.1)  # took 10 ms: quick
    second = _exec("s", "2", LOCAL)
    assert _of(s.handle(second, 1.2), Run) == [Run(second, LOCAL, inline=True)]
    s.handle(_done("s", "2"), 1.3)
    s.handle(_exec("s", "slow", MOVING), 1.4)  # queued on the pool
    third = _exec("s", "3", LOCAL)
    assert _of(s.handle(third, 1.5), Run) == [Run(third, LOCAL, inline=False)]  # order holds
    s.handle(RunFinished("s", "3", 0.5, Done("s", "3", RANK)), 1.6)  # took 500 ms
    s.handle(_done("s", "slow"), 1.7)
    fourth = _exec("s", "4", LOCAL)
    assert _of(s.handle(fourth, 1.8), Run) == [Run(fourth, LOCAL, inline=False)]
    assert s.inline == 1


def _snapshot(s: WorkerState) -> Any:
    return (
        dict(s.jobs), dict(s.queued), list(s.quick.items()), dict(s.aborted), s.done,
        s.inline, s.last_heard, list(s.programs._items),
    )  # fmt: skip


def _quick_twice() -> tuple[WorkerState, WorkerState]:
    """Two states alike, each having run job 1 of session "s" (program LOCAL) quickly:
    one to take the next jobs by events (handle), one by the hot path (begin_inline)."""
    states = _state(), _state()
    for s in states:
        s.inline_s = 0.05
        s.handle(_exec("s", "1", LOCAL), 1.0)
        s.handle(_done("s", "1"), 1.1)  # quick: its next runs are inline
    return states


def test_the_hot_path_decides_a_repeat_quick_job_as_handle_does() -> None:
    by_events, by_hot_path = _quick_twice()
    job = _exec("s", "2", LOCAL)
    assert _of(by_events.handle(job, 1.2), Run) == [Run(job, LOCAL, inline=True)]
    assert by_hot_path.begin_inline(job, 1.2) is LOCAL
    assert _snapshot(by_hot_path) == _snapshot(by_events)
    assert by_events.handle(_done("s", "2"), 1.3) == [Post(Done("s", "2", RANK))]
    by_hot_path.end_inline("s", "2", 0.01)
    assert _snapshot(by_hot_path) == _snapshot(by_events)
    assert by_hot_path.inline == 1 and by_hot_path.done == 2


def test_a_programs_repeats_on_the_hot_path_keep_the_program_cache_as_handle_does() -> None:
    # a program's next jobs take the graph found for the last one while no program was
    # put or looked up since: the cache's order stays what handle's lookups make it
    by_events, by_hot_path = _quick_twice()
    last = _exec("s", "1", LOCAL)  # the program's last Exec, its next jobs by their ids
    other = _graph("constant", name="other")
    steps: list[Any] = [
        _exec("t", "m1", MOVING),  # another program looked up
        Program(other.digest, other),  # another put
        Program(LOCAL.digest, LOCAL),  # this one put again
        None,
    ]
    for n, step in enumerate(steps):
        for i in range(3):
            job = f"{n}-{i}"
            by_events.handle(_exec("s", job, LOCAL), 1.2)
            assert by_hot_path.begin_inline(last, 1.2, job) is LOCAL
            assert list(by_hot_path.programs._items) == list(by_events.programs._items)
            by_events.handle(_done("s", job), 1.3)
            by_hot_path.end_inline("s", job, 0.01)
        if step is not None:
            for s in (by_events, by_hot_path):
                s.handle(step, 1.4)
            assert list(by_hot_path.programs._items) == list(by_events.programs._items)


def test_the_hot_path_leaves_every_other_job_to_handle_untouched() -> None:
    s = _state()
    s.inline_s = 0.05
    s.handle(_exec("s", "1", LOCAL), 1.0)
    s.handle(_done("s", "1"), 1.1)
    s.handle(_exec("q", "slow", MOVING), 1.2)  # session q has a task queued
    s.handle(_abort("s", "early"), 1.2)  # aborted before its Exec came
    s.handle(SessionClosed("gone", "bye"), 1.2)
    s.refused_code[MOVING.digest] = "no pickles here"
    before = _snapshot(s)
    for job in (
        _exec("s", "m", MOVING),  # not local (nor quick)
        _exec("s", "x", _graph("constant", name="never ran")),  # not cached, not quick
        _exec("q", "2", LOCAL),  # its session is busy: arrival order
        _exec("gone", "2", LOCAL),  # its session closed
        _exec("s", "early", LOCAL),  # already aborted
        _exec("q", "slow", LOCAL),  # a job already known
    ):
        assert s.begin_inline(job, 2.0) is None, job
        assert _snapshot(s) == before
    assert s.begin_inline(_exec("s", "3", LOCAL), 2.0) is LOCAL
    s.handle(_abort("s", "3"), 2.1)  # stopped while it ran: handle frees it, says nothing
    assert s.done == 1 and ("s", "3") in s.jobs
    assert FreeJob(("s", "3")) in s.handle(_done("s", "3"), 2.2)


def test_the_hot_path_sees_every_stop_made_after_it_last_found_a_session_clear() -> None:
    # begin_inline looks at the closed sessions and refused programs again only once an
    # entry was made in them (state.stops): each kind of stop, made between two repeats
    s = _state()
    s.inline_s = 0.05
    s.handle(_exec("s", "1", LOCAL), 1.0)
    s.handle(_done("s", "1"), 1.1)
    assert s.begin_inline(_exec("s", "2", LOCAL), 1.2) is LOCAL  # found clear, remembered
    assert not s.stopped_inline("s", "2")
    s.handle(_abort("s", "3"), 1.3)  # before its Exec came
    assert not s.stopped_inline("s", "2")  # another job's stop
    s.end_inline("s", "2", 0.01)
    assert s.begin_inline(_exec("s", "3", LOCAL), 1.4) is None
    assert s.begin_inline(_exec("s", "4", LOCAL), 1.5) is LOCAL
    s.handle(_abort("s", "4"), 1.6)  # while it ran
    assert s.stopped_inline("s", "4")
    s.handle(RunFinished("s", "4", 0.01, Done("s", "4", RANK)), 1.7)
    assert s.begin_inline(_exec("s", "5", LOCAL), 1.8) is LOCAL
    s.end_inline("s", "5", 0.01)
    s.handle(CodeRefused(LOCAL.digest, "no pickles here"), 1.9)
    assert s.begin_inline(_exec("s", "6", LOCAL), 2.0) is None
    t = _state()
    t.inline_s = 0.05
    t.handle(_exec("s", "1", LOCAL), 1.0)
    t.handle(_done("s", "1"), 1.1)
    assert t.begin_inline(_exec("s", "2", LOCAL), 1.2) is LOCAL
    t.handle(SessionClosed("s", "bye"), 1.3)  # while it ran
    assert t.stopped_inline("s", "2")
    assert t.begin_inline(_exec("s", "3", LOCAL), 1.4) is None


_STOPS: list[Any] = []  # what the functions below call as they run (pickled by name)


def _stop_then_seven() -> int:
    for stop in _STOPS:
        stop()
    return 7


def _stop_then_seven_in_a_tuple() -> tuple[int]:
    return (_stop_then_seven(),)


def _stopping_graph(*, compiled: bool) -> Graph:
    """A local graph whose one function calls what ``_STOPS`` holds and returns 7: a plain
    call (which the job shell runs compiled), or one behind a ``getitem`` (which it does
    not)."""
    b = GraphBuilder(2)
    fn = _stop_then_seven if compiled else _stop_then_seven_in_a_tuple
    (out,) = b.op("pcall", [], ranks=(RANK,), fn=b.fn(fn))
    if not compiled:
        (out,) = b.op("getitem", [out], ranks=(RANK,), key=0)
    return b.build([out])


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("how", ["abort", "close"])
def test_a_repeat_quick_job_stopped_while_it_runs_inline_says_nothing(
    compiled: bool, how: str
) -> None:
    """The job shell's inline path (``Jobs.run_now``) looks again once the run is over:
    a job aborted, or whose session closed, while it ran posts no Done, and the state
    frees its outputs; the same program's next job answers as before."""
    state = _state()
    state.inline_s = 60.0  # counts, not time: no run on a busy machine is "slow"
    posted: list[Any] = []
    shell = Jobs(state, ObjectStore(), move_mailbox(), None, posted.append)  # type: ignore[arg-type]
    stop_job: list[str] = []

    def stop() -> None:  # what another thread (or this one's next message) may do meanwhile
        if stop_job:
            error = ErrorInfo("RemoteError", "rank 1 failed")
            stopping = Abort("s", stop_job[0], error) if how == "abort" else None
            shell.handle(stopping or SessionClosed("s", "bye"))

    graph = _stopping_graph(compiled=compiled)
    _STOPS[:] = [stop]
    state.handle(Program(graph.digest, graph), 0.0)
    state.handle(Exec("s", "1", graph.digest, (0, 1), {}, (0,)), 1.0)
    state.handle(_done("s", "1"), 1.1)  # quick: its next runs are inline
    assert shell.run_now(Exec("s", "2", graph.digest, (0, 1), {}, (0,)))
    assert [type(m) for m in posted] == [Done] and posted[0].values == {0: 7}
    assert shell.store.has("s", "2/0") and state.done == 2
    stop_job.append("3")
    assert shell.run_now(Exec("s", "3", graph.digest, (0, 1), {}, (0,)))
    assert len(posted) == 1, "a job stopped while it ran answered"
    assert not shell.store.has("s", "3/0"), "its outputs were kept"
    _STOPS.clear()
    assert state.done == 2 and ("s", "3") not in state.jobs and ("s", "3") not in state.aborted


def test_a_repeat_quick_job_posts_its_done_before_the_state_ends_it() -> None:
    """The Done leaves as soon as it exists: the state's bookkeeping of the job's end (on
    the broker's critical path before) follows the send."""
    b = GraphBuilder(2)
    (one,) = b.op("constant", [], ranks=(RANK,), value=1)
    graph = b.build([one])
    state = _state()
    state.inline_s = 60.0  # counts order, not time: no run on a busy machine is "slow"
    state.handle(Program(graph.digest, graph), 0.0)
    state.handle(Exec("s", "1", graph.digest, (0, 1), {}, (0,)), 1.0)
    state.handle(_done("s", "1"), 1.1)  # quick: its next runs are inline
    seen: list[tuple[Any, bool, int]] = []

    def post(msg: Any) -> None:  # what the state had made of the job when its Done went
        seen.append((msg, ("s", "2") in state.jobs, state.done))

    shell = Jobs(state, ObjectStore(), move_mailbox(), None, post)  # type: ignore[arg-type]
    assert shell.run_now(Exec("s", "2", graph.digest, (0, 1), {}, (0,)))
    [(done, running, done_before)] = seen
    assert type(done) is Done and done.job == "2" and done.values == {0: 1}
    assert running and done_before == 1, "the state ended the job before its Done went out"
    assert ("s", "2") not in state.jobs and state.done == 2 and state.quick[graph.digest]


def test_a_compiled_inline_run_reports_progress_as_a_pooled_run_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quick program's run that turns long reports where it is, as a pooled run does:
    here every op's start is past the first report's time (set to before the run)."""
    from mpl.worker import inline_jobs, job_run

    for module in (inline_jobs, job_run):  # when the run checks, and when the report says
        monkeypatch.setattr(module, "FIRST_AFTER_S", -1.0)
    b = GraphBuilder(2)
    (one,) = b.op("pcall", [], ranks=(RANK,), fn=b.fn(_stop_then_seven))
    (two,) = b.op("pcall", [one], ranks=(RANK,), fn=b.fn(abs))
    graph = b.build([two])
    state = _state()
    state.inline_s = 60.0
    state.handle(Program(graph.digest, graph), 0.0)
    state.handle(Exec("s", "1", graph.digest, (0, 1), {}, (0,)), 1.0)
    state.handle(_done("s", "1"), 1.1)
    posted: list[Any] = []
    shell = Jobs(state, ObjectStore(), move_mailbox(), None, posted.append)  # type: ignore[arg-type]
    assert shell.run_now(Exec("s", "2", graph.digest, (0, 1), {}, (0,)))
    progress = [m for m in posted if type(m) is Progress]
    assert [(m.job, m.done, m.total) for m in progress] == [("2", 0, 2)]  # then not again
    assert progress[0].op.startswith("0 (pcall") and type(posted[-1]) is Done


# -- the job shell over the state: real mailbox and store, no sockets ------------------------
@pytest.fixture
def jobs() -> Jobs:
    posted: list[Any] = []
    shell = Jobs(_state(), ObjectStore(), move_mailbox(), None, posted.append)  # type: ignore[arg-type]
    shell.posted = posted  # type: ignore[attr-defined]
    return shell


def _waiting_for_a_move(jobs: Jobs, session: str, job: str) -> Callable[[], BaseException]:
    """A job thread of ``job`` waiting for a move that never comes (its deadline 30 s away),
    its group open; the callable returned joins it and gives what its wait raised."""
    jobs.state.handle(_exec(session, job), 1.0)  # decided, not run: the test plays the job
    jobs.mailbox.open((session, job))
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            jobs.mailbox.take((session, job, 1, 0, 1, ""), time.monotonic() + 30, "never", job=job)
        except BaseException as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    wait_until(lambda: (session, job) in jobs.mailbox._open, what="the waiter to wait")

    def outcome() -> BaseException:
        waiter.join(5)
        (exc,) = raised
        return exc

    return outcome


def test_a_session_close_wakes_waiters_frees_values_and_drops_late_moves(jobs: Jobs) -> None:
    jobs.store.put("s", "job:old/0", 42)
    outcome = _waiting_for_a_move(jobs, "s", "j")
    jobs.handle(SessionClosed("s", "the driver left"))
    exc = outcome()
    assert isinstance(exc, JobAbortedError) and "the driver left" in str(exc)
    assert not jobs.store.has("s", "job:old/0")
    assert not jobs.mailbox.put(("s", "j", 2, 0, 1, ""), "late") and jobs.mailbox.late == 1


def test_an_abort_releases_a_job_waiting_for_a_move(jobs: Jobs) -> None:
    outcome = _waiting_for_a_move(jobs, "s", "k")
    jobs.handle(_abort("s", "k", "rank 1 was lost"))
    exc = outcome()
    assert isinstance(exc, JobAbortedError) and "rank 1 was lost" in str(exc)
