"""``mp.save`` / ``mp.load`` inside ``@mp.function`` are ops of the one job (issue 11, gap 1).

The workers holding a value run the save (session names, or their own party's file), a load
reads each party's own value, and the broker learns the names a job saved from the workers'
``Done``, each rank speaking for itself, never from the driver.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpl.driver as mp
from mpl.broker.state import BrokerState, Send
from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.control import WorkerHello
from mpl.wire.errors import GraphError, RemoteError, SessionError
from mpl.wire.graph import Graph, Op
from mpl.wire.jobs import Done, Exec, Failed, JobResult, Program
from mpl.wire.limits import MAX_JOB_SAVES, MAX_SESSION_SYMBOLS
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import OpenSession, SessionOpened, SymbolInfo
from mpl.worker.interpreter import OpFailed, Plan, run_graph
from mpl.worker.store import ObjectStore, SymbolDisk

W = [b"w0", b"w1", b"w2"]
D = b"drv"
_REQUESTS = ("Exec", "SaveSymbol", "LoadSymbol", "DeleteSymbol", "Fetch")


def _on_p(rank: int) -> Any:
    return mp.device(f"P{rank}")


@contextmanager
def _simulator(data_root: Path) -> Iterator[Any]:
    """A 2-party Simulator on ``data_root``, current in the block and closed after it."""
    sim = mp.Simulator.simple(2, data_root=data_root)
    try:
        with sim:
            yield sim
    finally:
        sim.close()


# -- the graph ops ----------------------------------------------------------------------------


def test_save_runs_on_exactly_the_holders_and_load_is_held_where_it_runs() -> None:
    b = GraphBuilder(3)
    v = b.op("pcall", [], ranks=(0, 1), fn=b.fn(abs))[0]
    b.op("save", [v], ranks=(0, 1), nout=0, symbol="m", persist=True, device="")
    with pytest.raises(GraphError, match=r"save must run on ranks @0,1"):
        b.op("save", [v], ranks=(0,), nout=0, symbol="m", persist=False, device="")
    with pytest.raises(GraphError, match="'persist'"):
        b.op("save", [v], ranks=(0, 1), nout=0, symbol="m", persist="yes", device="")
    with pytest.raises(GraphError, match="'symbol'"):
        b.op("load", [], ranks=(2,), symbol=7, device="")
    (w,) = b.op("load", [], ranks=(1, 2), symbol="m", device="")
    assert b.placements[w] == (1, 2)
    text = str(b.build([w]))
    assert "save[device='', persist=True, symbol='m'](%0) on @0,1" in text
    assert "load[device='', symbol='m']() on @1,2 -> @1,2" in text


class _Job:
    """A job's context for the interpreter alone: a real store, nothing else."""

    session, job, deadline, sealer = "s", "j", 0.0, ""

    def __init__(self, rank: int, store: ObjectStore) -> None:
        self.rank, self.store = rank, store
        self.spans: list[list[Any]] = []
        self.saved: list[SymbolInfo] = []

    started, next_report = 0.0, float("inf")
    position: tuple[int, int, Graph, int] | None = None

    def report(self, now: float) -> None:
        pass

    # the rest of JobContext: the graphs run here move nothing and use no extension
    def send(self, dst: int, op: int, seq: int, value: Any) -> None:
        raise AssertionError("no op here sends")

    def recv(self, src: int, op: int, seq: int) -> Any:
        raise AssertionError("no op here receives")

    def extension(self, name: str) -> Any:
        raise KeyError(name)


def test_a_save_on_a_rank_that_does_not_hold_the_value_names_nothing(tmp_path: Path) -> None:
    # a graph the driver's checker refuses (the save runs on rank 1, the value is on rank 0),
    # as a hostile or broken driver could still send it
    b = GraphBuilder(2)
    v = b.op("pcall", [], ranks=(0,), fn=b.fn(lambda: 5))[0]
    ok = b.build([v])
    save = Op("save", (0,), 0, (0, 1), {"symbol": "x", "persist": True, "device": ""})
    graph = Graph(2, (), (*ok.ops, save), (), ok.fns)
    store = ObjectStore(SymbolDisk(tmp_path))
    job = _Job(1, store)
    with pytest.raises(OpFailed, match=r"\(save 'x'\).*does not hold the value"):
        run_graph(Plan.build(graph, 1), [], job)
    assert job.saved == [] and store.disk is not None and store.disk.infos() == []
    job0 = _Job(0, store)
    run_graph(Plan.build(graph, 0), [], job0)  # the holder saves its own part
    assert [i.name for i in job0.saved] == ["x"] and store.disk.load("x") == 5


# -- one job, one request ---------------------------------------------------------------------


def _spy_requests(sim: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The broker's own view of what drivers ask: every request record it handles."""
    state: BrokerState = sim.runtime.broker.state
    seen: list[str] = []
    handle = state.handle

    def counting(peer: bytes, msg: Record, *args: Any, **kw: Any) -> list[Send]:
        if type(msg).__name__ in _REQUESTS and state.registry.worker(peer) is None:
            seen.append(type(msg).__name__)
        return handle(peer, msg, *args, **kw)

    def counting_exec(peer: bytes, msg: Exec, *args: Any, **kw: Any) -> list[Send]:
        seen.append(type(msg).__name__)  # the hot Exec's own entry point (drivers only)
        return exec_read(peer, msg, *args, **kw)

    exec_read = state.exec_read
    monkeypatch.setattr(state, "handle", counting)
    monkeypatch.setattr(state, "exec_read", counting_exec)
    return seen


def test_a_function_that_saves_and_loads_is_one_job_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _simulator(tmp_path) as sim:
        mp.save(mp.put("P0", np.arange(3.0)), "weights", persist=True)

        @mp.function
        def step(scale: Any) -> Any:
            w = mp.load("weights", parties="P0")  # the party's own file, read in the job
            out = _on_p(0)(lambda a, s: a * s)(w, scale)
            mp.save(out, "scaled")
            mp.save(out, "kept", persist=True)
            again = mp.load("scaled")  # saved just above, in this same job
            return _on_p(0)(np.sum)(again)

        scale = mp.put("P0", 2.0)
        requests = _spy_requests(sim, monkeypatch)
        total = step(scale)
        assert requests == ["Exec"]  # traced and run: nothing but the one job
        assert mp.fetch(total) == 6.0
        assert mp.fetch(mp.load("scaled")).tolist() == [0.0, 2.0, 4.0]
        listed = {(s["name"], s["persist"]) for rows in mp.symbols().values() for s in rows}
        assert {("scaled", False), ("kept", True)} <= listed
        scale = mp.put("P0", 3.0)
        requests.clear()
        step(scale)  # a cached program: again one job and nothing else
        assert requests == ["Exec"]
    with _simulator(tmp_path):  # another cluster on the same disks
        assert mp.fetch(mp.load("kept")).tolist() == [0.0, 3.0, 6.0]


def test_an_spu_value_saved_in_a_job_keeps_a_share_on_each_member(tmp_path: Path) -> None:
    with _simulator(tmp_path):

        @mp.function
        def seal() -> Any:
            a = mp.put("SP0", _on_p(0)(lambda: np.arange(3.0))())
            doubled = mp.device("SP0")(lambda x: x * 2)(a)
            mp.save(doubled, "secret", persist=True)
            mp.save(doubled, "shared")
            return mp.device("SP0")(lambda x: x + 1)(mp.load("shared"))

        assert np.allclose(mp.fetch(seal()), [1.0, 3.0, 5.0], atol=1e-4)
        rows = mp.symbols()
        assert [(r["name"], r["device"], r["parties"]) for r in rows["session"]] == [
            ("shared", "SP0", [0, 1])
        ]
        assert sorted(r["rank"] for r in rows["persisted"] if r["name"] == "secret") == [0, 1]

        @mp.function
        def total() -> Any:  # each member reads its own share from its own disk
            return mp.device("SP0")(lambda x: x.sum())(mp.load("secret", parties="SP0"))

        assert abs(mp.fetch(total()) - 6.0) < 1e-3


def test_a_session_name_saved_twice_on_different_parties_is_refused_when_traced(
    tmp_path: Path,
) -> None:
    with _simulator(tmp_path):

        @mp.function
        def twice() -> None:
            mp.save(_on_p(0)(lambda: 1)(), "x")
            mp.save(_on_p(1)(lambda: 2)(), "x")

        with pytest.raises(mp.MplError, match="saved twice"):
            twice()


# -- errors -----------------------------------------------------------------------------------


def test_a_bad_name_fails_the_job_at_the_save_naming_it(tmp_path: Path) -> None:
    with _simulator(tmp_path):

        @mp.function
        def bad(persist: bool) -> Any:
            v = _on_p(0)(lambda: np.ones(2))()
            mp.save(v, "first")
            mp.save(v, "../evil", persist=persist)
            return v

        for persist in (False, True):
            with pytest.raises(RemoteError, match=r"\(save '\.\./evil'\).*bad value name") as err:
                bad(persist)
            assert err.value.rank == 0
        assert not list(tmp_path.rglob("evil*"))
        with pytest.raises(SessionError, match="no value named 'first'"):
            mp.load("first")  # the failed job named nothing at the broker


def test_loading_a_missing_name_fails_the_job_naming_the_load(tmp_path: Path) -> None:
    with _simulator(tmp_path):

        @mp.function
        def reads() -> Any:
            return _on_p(1)(lambda a: a + 1)(mp.load("nowhere", parties=1))

        missing = r"\(load 'nowhere'\).*no value named 'nowhere'"
        with pytest.raises(RemoteError, match=missing) as err:
            reads()
        assert err.value.rank == 1


# -- the broker learns names from the workers only --------------------------------------------


def _broker() -> tuple[BrokerState, str, Program]:
    state = BrokerState(ClusterSpec.simple(3, enable_spu=False), now=0.0, broker_id="B")
    for rank in range(3):
        state.handle(W[rank], WorkerHello(rank, f"i{rank}", 100, "h", f"tcp://x:{rank}", ""), 0.0)
    opened = state.handle(D, OpenSession(1, "", 60.0, "c"), 0.0)
    sid = next(a.msg.session for a in opened if isinstance(a.msg, SessionOpened))
    b = GraphBuilder(3)
    v = b.op("pcall", [], ranks=(0, 1), fn=b.fn(abs))[0]
    b.op("save", [v], ranks=(0, 1), nout=0, symbol="m", persist=False, device="")
    graph = b.build([])
    program = Program(graph.digest, graph)
    state.handle(D, program, 0.0)
    return state, sid, program


def _result(actions: list[Send]) -> JobResult:
    return next(a.msg for a in actions if isinstance(a.msg, JobResult))


def _symbols(state: BrokerState, sid: str) -> dict[str, SymbolInfo]:
    entry = state.sessions.get(sid)
    assert entry is not None
    return entry.symbols


def _info(name: str, ranks: tuple[int, ...], persist: bool = False) -> SymbolInfo:
    return SymbolInfo(name, "", ranks, persist, {"meta": "int"})


def test_the_broker_names_what_every_holder_reported_and_persisted_entries_per_rank() -> None:
    state, sid, program = _broker()
    state.handle(D, Exec(sid, "j", program.digest, (0, 1), {}), 0.1)
    saved0 = [_info("m", (0, 1)), _info("own", (0, 1), persist=True)]
    state.handle(W[0], Done(sid, "j", 0, saved=saved0), 0.2)
    assert set(state.persisted.holders("own")) == {0}  # rank 0's file, recorded at once
    assert "m" not in _symbols(state, sid)  # not until every holder said so
    out = state.handle(W[1], Done(sid, "j", 1, saved=[_info("m", (0, 1))]), 0.3)
    assert _result(out).error is None
    assert _symbols(state, sid)["m"].ranks == (0, 1)


def test_a_rank_cannot_name_values_for_other_ranks() -> None:
    state, sid, program = _broker()
    state.handle(D, Exec(sid, "j", program.digest, (0, 1), {}), 0.1)
    claims = [
        _info("theirs", (1,), persist=True),  # another rank's file
        _info("far", (0, 2), persist=True),  # a rank outside the job
        _info("../up", (0,), persist=True),  # a name that would be a path
        _info("half", (0, 1)),  # a two-rank session value only rank 0 speaks for
    ]
    forged = state.counters["forged_replies"]
    state.handle(W[0], Done(sid, "j", 0, saved=claims), 0.2)
    out = state.handle(W[1], Done(sid, "j", 1), 0.3)
    assert _result(out).error is None
    assert state.persisted.names() == [] and _symbols(state, sid) == {}
    assert state.counters["forged_replies"] == forged + 4


def test_a_file_written_by_a_job_that_failed_elsewhere_is_still_listed_for_its_party() -> None:
    state, sid, program = _broker()
    state.handle(D, Exec(sid, "j", program.digest, (0, 1), {}), 0.1)
    failed = Failed(sid, "j", 1, ErrorInfo("ValueError", "boom", rank=1, job="j"))
    assert _result(state.handle(W[1], failed, 0.2)).error is not None
    late = [_info("disk", (0, 1), persist=True), _info("m", (0, 1))]
    assert state.handle(W[0], Done(sid, "j", 0, saved=late), 0.3) == []
    assert set(state.persisted.holders("disk")) == {0}  # rank 0's file is on its disk
    assert _symbols(state, sid) == {}  # the failed job named nothing


def test_a_job_saving_past_the_sessions_name_bound_names_nothing_and_fails() -> None:
    state, sid, program = _broker()
    session = state.sessions.get(sid)
    assert session is not None
    filler = _info("f", (0,))
    session.symbols.update({f"f{i}": filler for i in range(MAX_SESSION_SYMBOLS - 1)})
    state.handle(D, Exec(sid, "j", program.digest, (0, 1), {}), 0.1)
    state.handle(W[0], Done(sid, "j", 0, saved=[_info("a", (0,)), _info("f1", (0,))]), 0.2)
    out = state.handle(W[1], Done(sid, "j", 1, saved=[_info("b", (1,))]), 0.3)
    error = _result(out).error
    assert error is not None and "at most" in error.message
    assert "a" not in session.symbols and "b" not in session.symbols  # all or none
    assert len(session.symbols) == MAX_SESSION_SYMBOLS - 1


def test_too_many_saved_names_from_one_rank_fail_the_job() -> None:
    state, sid, program = _broker()
    state.handle(D, Exec(sid, "j", program.digest, (0, 1), {}), 0.1)
    flood = [_info(f"n{i}", (0,), persist=True) for i in range(MAX_JOB_SAVES + 1)]
    out = state.handle(W[0], Done(sid, "j", 0, saved=flood), 0.2)
    error = _result(out).error
    assert error is not None and "MAX_JOB_SAVES" in error.message
    assert state.persisted.names() == [] and "j" not in state.calls.jobs


# -- real daemons -----------------------------------------------------------------------------


@pytest.mark.daemons
def test_two_parties_save_one_name_in_a_job_and_both_survive_a_broker_restart(
    make_cluster: Any,
) -> None:
    cluster = make_cluster("tcp", world_size=2)

    @mp.function
    def publish() -> Any:
        mp.save(_on_p(0)(lambda: np.arange(3))(), "model", persist=True)
        mp.save(_on_p(1)(lambda: np.full(2, 7.0))(), "model", persist=True)
        return _on_p(0)(lambda a: a.sum())(mp.load("model", parties=0))  # read back at once

    with contextlib.closing(mp.connect(cluster.address, driver="writer")) as writer, writer:
        assert mp.fetch(publish()) == 3

    def check() -> None:
        reader = mp.connect(cluster.address, driver="reader")  # another session
        with contextlib.closing(reader), reader:
            with pytest.raises(SessionError, match="several parties"):
                mp.load("model")
            assert mp.fetch(mp.load("model", parties=(0,))).tolist() == [0, 1, 2]
            assert mp.fetch(mp.load("model", parties="P1")).tolist() == [7.0, 7.0]

            @mp.function
            def reads() -> Any:  # each party reads its own file inside the job
                return _on_p(1)(lambda a: a.sum())(mp.load("model", parties=1))

            assert mp.fetch(reads()) == 14.0

    check()
    cluster.impl.kill_broker()
    cluster.impl.start_broker()
    cluster.impl.wait_ready(10.0)
    check()


@pytest.mark.daemons
def test_a_save_inside_a_job_in_secure_mode(tmp_path: Path) -> None:
    with mp.local_cluster(2, secure=True, run_dir=tmp_path) as ctx, ctx:

        @mp.function
        def keep() -> Any:
            v = _on_p(1)(lambda: np.arange(4))()
            mp.save(v, "held")
            mp.save(v, "disk", persist=True)
            return _on_p(1)(lambda a: a * 2)(mp.load("held"))

        assert mp.fetch(keep()).tolist() == [0, 2, 4, 6]
        assert mp.fetch(mp.load("held")).tolist() == [0, 1, 2, 3]
        assert mp.fetch(mp.load("disk", parties=1)).tolist() == [0, 1, 2, 3]
        listed = {(s["name"], s["persist"]) for rows in mp.symbols().values() for s in rows}
        assert {("held", False), ("disk", True)} <= listed
