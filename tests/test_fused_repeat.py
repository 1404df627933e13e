"""The job shell's one inline run (``Jobs.run_repeat``) against the interpreter's run.

``Worker._turn`` runs a plaintext program's next ``Exec`` (said by its job id) through
``Jobs.run_repeat``, one call for the run, the output stored, the Done and the state's
books (``ObjectStore.put_output`` and ``WorkerState.end_inline`` written out in its common
case); every other inline run goes through it too (``run_now``). Two job shells, alike but
for one thing, are given the same stream of repeats, valid and mutated (another or a
closed session, an unknown digest, inputs bound on this rank, another timeout, long and bad
job ids, stale and aborted job ids, a queued session, refused code, outputs the template
does not pack, failing runs, stops landing during the run): one runs its programs
compiled, by ``run_repeat`` as the turn calls it and, when that declines, ``run_now``; the
other cannot compile them, so ``run_now`` runs each as a pooled job runs (``Jobs._run``:
the interpreter, ``_timeout``, ``_resolve``, ``_store_outputs``, a record posted, the
state's ``end_inline``). Their answers (Done frames against records encoded, byte for
byte) and their books (the state's tables and counts, the store) must be the same after
every step; the compiled path must decline with nothing done exactly where the other does.
"""

from __future__ import annotations

import re
import time as real_time
from collections.abc import Callable
from typing import Any

import pytest

from mpl.wire.codec import encode
from mpl.wire.control import Welcome, WorkerHello
from mpl.wire.graph import Graph, GraphBuilder
from mpl.wire.jobs import Abort, Done, Exec, Failed, Program
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SessionClosed
from mpl.worker import inline_jobs, inline_run, interpreter, jobs
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.state import WorkerState
from mpl.worker.state_events import MoveRefused, RunFinished
from mpl.worker.store import ObjectStore

RANK = 0
# the worker's own frames in a failed run's traceback (where the paths differ), each with
# its source line and any marks under it, up to the next frame
_WORKER_FRAMES = re.compile(r'  File "[^"]*/worker/\w+\.py", line \d+, in \S+\n(?:    .*\n)*')

# what the program's one call does on its next run: a value to return, an exception to
# raise, or a function to call (which may stop the job meanwhile) for the value
_NEXT: list[Any] = [1]


def _program() -> Any:
    act = _NEXT[0]
    if isinstance(act, BaseException):
        raise type(act)(*act.args)  # a new one each time: a raised one keeps its traceback
    return act() if callable(act) else act


def _another() -> Any:
    return _program()


def _graph(fn: Callable[[], Any] = _program) -> Graph:
    """A program of one call of ``fn`` on this rank (its op label names it)."""
    b = GraphBuilder(2)
    # no arguments, said as the driver says it: the job shell makes the call itself
    (out,) = b.op("pcall", [], ranks=(RANK,), fn=b.fn(fn), args=[], kwargs={})
    return b.build([out])


class _Clock:
    """``time`` for the job shell: a fixed clock, so both paths' Done frames (run seconds,
    start on the wall clock) can be compared byte for byte."""

    def monotonic(self) -> float:
        return 5.0

    def time(self) -> float:
        return 1_700_000_000.25

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)


class _Shell:
    """A job shell of rank 0 whose answers are kept as bytes, in order. ``compiled``:
    whether it may compile its programs (else each runs as a pooled job runs)."""

    def __init__(self, *graphs: Graph, compiled: bool) -> None:
        hello = WorkerHello(RANK, "inc", 1, "h", "tcp://d", "", [])
        state = WorkerState(hello, now=0.0, heartbeat_s=1.0)
        state.handle(Welcome(RANK, 2, "B1", 1.0, {}), 0.0)
        state.inline_s = 60.0  # counts, not time: no run here is "slow"
        self.answers: list[bytes] = []  # each answer's bytes as the broker reads them
        self.kinds: set[str] = set()  # the ways they were given
        self.jobs = Jobs(
            state,
            ObjectStore(),
            move_mailbox(),
            None,  # type: ignore[arg-type]  # no peers: the program is local
            self._post,
            post_frames=lambda frames: self._said("frames", b"".join(frames)),
            post_frame=lambda frame: self._said("frame", frame),
        )
        self.state = state
        self.fused = 0  # repeats run_repeat answered with a frame
        self.declined = 0  # repeats run_repeat left to the full path
        for graph in graphs:
            state.handle(Program(graph.digest, graph), 0.0)
            for sid in ("s", "t"):  # a first (pooled) run of each program in each, quick
                state.handle(Exec(sid, graph.digest, graph.digest, (0, 1), {}, (0,)), 1.0)
                done = Done(sid, graph.digest, RANK)
                state.handle(RunFinished(sid, graph.digest, 0.01, done), 1.1)
            if not compiled:
                self.jobs._compiled[graph.digest] = None  # as if its plan did not compile

    def _said(self, kind: str, data: bytes) -> None:
        self.kinds.add(kind)
        self.answers.append(data)

    def _post(self, msg: Record) -> None:
        if type(msg) is Failed:  # its traceback names the job shell's frame: not compared
            error = msg.error
            where = _WORKER_FRAMES.sub("", error.traceback)
            msg = Failed(
                msg.session,
                msg.job,
                msg.rank,
                ErrorInfo(
                    error.kind,
                    error.message,
                    error.rank,
                    error.op,
                    error.remote_type,
                    where,
                    error.job,
                ),
            )
        self._said(type(msg).__name__, b"".join(bytes(f) for f in encode(msg)))

    def full(self, last: Exec, job: str) -> bool:
        """``_on_repeat``'s ``run_now`` (on the shell that does not compile)."""
        return self.jobs.run_now(last, job)

    def fused_first(self, last: Exec, job: str) -> bool:
        """``Worker._turn``'s: ``run_repeat``, its frame sent; else the full path."""
        got = self.jobs.run_repeat(last, job)
        if got is None:
            self.declined += 1
            return self.jobs.run_now(last, job)
        if got:
            self.fused += 1
            self._said("frame", got)
        return True

    def books(self) -> Any:
        state = self.state
        return (
            self.jobs._last_timeout,
            state.done,
            state.failed,
            state.inline,
            sorted(state.jobs.items()),
            list(state.quick.items()),
            list(state.aborted.items()),
            list(state.closed.items()),
            {sid: dict(held) for sid, held in self.jobs.store._outputs.items()},
        )


def _stop_during_run(shell: _Shell, sid: str, job: str, value: Any) -> Callable[[], Any]:
    """A run that, while it runs, has the peer thread report a refused move of its job."""

    def run() -> Any:
        refused = MoveRefused(sid, job, ErrorInfo("RemoteError", "a move held pickles"))
        shell.jobs.report(refused)
        return value

    return run


def _steps(digest: str) -> list[tuple[str, dict[str, Any]]]:
    """(what, how) for each repeat: how names the mutation (see _apply)."""
    steps: list[tuple[str, dict[str, Any]]] = []
    packed: tuple[Any, ...] = (1, 7, 2.5, True, None, False, 127)
    unpacked: tuple[Any, ...] = (128, -1, 2**70, "text", (1, 2), b"bytes", [3])
    steps += [(f"value {value!r}", {"value": value}) for value in packed]
    steps += [(f"unpacked {value!r}", {"value": value}) for value in unpacked]  # by fields
    steps += [
        ("again", {}),
        ("held nowhere", {"inline": ()}),
        ("another program", {"other": True}),
        ("back", {}),
        ("another program", {"other": True}),
        ("another program again", {"other": True}),
        ("back", {}),
        ("raises", {"value": ValueError("no")}),
        ("exits", {"value": SystemExit(3)}),
        ("again", {}),
        ("another timeout", {"timeout_s": 3.0}),
        ("a bad timeout", {"timeout_s": -1.0}),
        ("a NaN timeout", {"timeout_s": float("nan")}),
        ("again", {}),
        ("another cap", {"cap": 7.0}),
        ("again", {}),
        ("inputs bound here", {"bindings": {RANK: ["out:nope/0"]}}),
        ("inputs bound elsewhere", {"bindings": {1: ["out:nope/0"]}}),
        ("again", {}),
        ("a long job id", {"job": "j" * 40}),
        ("a 31-byte job id", {"job": "k" * 31}),
        ("a job id not ASCII", {"job": "jöb-ü"}),  # (repeat_frame decodes UTF-8 ids only)
        ("a long job id not ASCII", {"job": "ü" * 16}),
        ("again", {}),
        ("unknown digest", {"digest": "f" * len(digest)}),
        ("again", {}),
        ("stale job id (running)", {"stale": True}),
        ("aborted before its Exec", {"abort_first": True}),
        ("again", {}),
        ("stopped during the run", {"stop": 1}),
        ("stopped during an unpacked run", {"stop": 300}),
        ("again", {}),
        ("another session", {"session": "t"}),
        ("again there", {"session": "t"}),
        ("an unknown session", {"session": "u"}),
        ("back", {}),
        ("queued session", {"queued": True}),
        ("again", {}),
        ("refused code", {"refuse": True}),
        ("session t closed", {"session": "t", "close": True}),
        ("again, closed", {"session": "t"}),
        ("back", {}),
    ]
    steps += [("again", {}) for _ in range(10)]
    # last: a run slower than inline_s makes the program no longer quick (its next job is
    # the pool's: declined)
    steps += [("a slow run", {"slow": True}), ("after a slow run", {})]
    return steps


def _apply(
    shell: _Shell, graph: Graph, other: Graph, n: int, how: dict[str, Any], fused: bool
) -> bool:
    """Make ``shell``'s world as ``how`` says, then give it repeat ``n``."""
    state = shell.state
    sid = how.get("session", "s")
    job = how.get("job", f"r{n}")
    if how.get("stale"):
        state.jobs[(sid, job)] = (graph.digest, True, False)
    if how.get("abort_first"):
        shell.jobs.handle(Abort(sid, job, ErrorInfo("RemoteError", "driver gave up")))
    if how.get("queued"):
        state.queued[sid] = 1
    if how.get("refuse"):
        state.refused_code[graph.digest] = "not today"
        state.stops += 1  # as the state's own entries are made (state.py)
    if how.get("slow"):  # (the clock stands still: every run takes 0 s)
        state.inline_s = -1.0
    if "cap" in how:  # the worker's --job-timeout, from this repeat on
        shell.jobs.job_timeout_s = how["cap"]
    if how.get("close"):
        shell.jobs.handle(SessionClosed(sid, "closed by its driver"))
    value = how.get("value", 1)
    _NEXT[0] = _stop_during_run(shell, sid, job, how["stop"]) if "stop" in how else value
    last = Exec(  # the program's last Exec read in full: the repeat is it but for `job`
        sid,
        "earlier",
        other.digest if how.get("other") else how.get("digest", graph.digest),
        (0, 1),
        how.get("bindings", {}),
        how.get("inline", (0,)),
        how.get("timeout_s", 0.0),
    )
    try:
        return shell.fused_first(last, job) if fused else shell.full(last, job)
    finally:
        if how.get("queued"):
            state.queued.pop(sid, None)
        if how.get("refuse"):
            state.refused_code.pop(graph.digest, None)


def test_the_fused_repeat_answers_and_books_exactly_as_the_full_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(inline_jobs, "time", clock)
    monkeypatch.setattr(jobs, "time", clock)
    monkeypatch.setattr(inline_run, "time", clock)
    monkeypatch.setattr(interpreter, "time", clock)
    graph, other = _graph(), _graph(_another)
    full, fused = _Shell(graph, other, compiled=False), _Shell(graph, other, compiled=True)
    for n, (what, how) in enumerate(_steps(graph.digest)):
        said = len(full.answers)
        ran_full = _apply(full, graph, other, n, how, fused=False)
        ran_fused = _apply(fused, graph, other, n, how, fused=True)
        assert ran_full == ran_fused, f"step {n} ({what}): inline {ran_full} against {ran_fused}"
        assert fused.answers == full.answers, f"step {n} ({what}): {full.answers[said:]}"
        assert fused.books() == full.books(), f"step {n} ({what})"
    # the common case took most repeats; the state declined the ones it must
    assert fused.fused >= 25, (fused.fused, fused.declined)
    assert fused.declined >= 6, (fused.fused, fused.declined)
    # each way of answering was met: a template's frame, fields' frames, a record's
    assert {"frame", "frames", "Failed", "Done"} <= fused.kinds, fused.kinds
    assert full.kinds <= {"Done", "Failed"}, full.kinds  # (no frame: the interpreter's run)
