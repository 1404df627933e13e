"""Review w30 of the per-driver code policy, the drivers' file folders and the fetch-reply
fix: attacks as a ``code: kernels`` driver (or a broker holding its key) and as another
listed driver. Each test fails while its attack works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_driver_code_policy import _graph, _job_of, _program, _refused_for_code
from test_session_driver_binding import _runs, _sealers

from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.errors import ClusterSpecError
from mpl.wire.jobs import Exec, Failed, Program
from mpl.wire.kernels import KernelRef
from mpl.wire.seal import Sealer, exec_context, program_context
from mpl.worker.kernel_table import KernelTable
from mpl.worker.sealing import WorkerSeal

__all__: list[str] = []


def _runner(root: Path) -> Any:
    table = KernelTable(lambda: {}, root=root, per_driver=True)

    def run(driver: str, kernel: str, *args: Any) -> Any:
        return table.resolve(kernel, "s", f"driver:{driver}")(*args)

    return run


@pytest.mark.parametrize("folder", ["Drivers", "DRIVERS", "driver\u017f", "Symbols", "SYMBOLS"])
def test_a_read_falls_back_to_no_other_spelling_of_the_drivers_or_symbols_folder(
    tmp_path: Path, folder: str
) -> None:
    """Finding 1 (medium on a case-insensitive file system: macOS's APFS and HFS+, Windows;
    none on Linux's usual ones). A read the driver's folder does not hold falls back to the
    data root, refused into ``drivers`` and ``symbols`` by comparing resolved paths, which
    keep the case a job wrote: where ``Drivers/analyst/out.npy`` is the file
    ``drivers/analyst/out.npy`` (a file system that folds case, ``\u017f`` to ``s`` too),
    mallory's ``read_npy("Drivers/analyst/out.npy")`` read the analyst's file. Here a
    folder of that other spelling stands for what such a file system shows there.

    Fixed: the fallback refuses a path whose first part below the data root is either
    folder by any spelling (casefolded), or the same folder on disk."""
    run = _runner(tmp_path)
    theirs = tmp_path / folder / "analyst"
    theirs.mkdir(parents=True)
    np.save(theirs / "out.npy", np.array([4.0, 2.0]))
    with pytest.raises(PermissionError):
        run("mallory", "mpl.io.read_npy", f"{folder}/analyst/out.npy")
    (tmp_path / "books.csv").write_text("1,2\n")  # the operator's files still read
    assert run("mallory", "mpl.io.read_csv", "books.csv").tolist() == [[1.0, 2.0]]


def test_a_spec_lists_no_two_drivers_whose_names_differ_only_by_case() -> None:
    """Finding 2 (low: a case-insensitive file system, and an operator listing, say, its
    own ``analyst`` beside another organisation's ``Analyst``). Each secure driver's files
    live in ``<data-root>/drivers/<name>``: there both names are one folder, so each
    driver's jobs read and replace the other's files. Fixed: such a spec is refused."""
    keys = [
        "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
        "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6",
        "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID",
        "Op9jC:9Nw]ZtHw9Sd^?aD.L(0Mlk+@RW%U/x?fh5",
    ]
    data = {
        "broker": {"curve_key": keys[0]},
        "nodes": [{"name": "n0", "curve_key": keys[1]}],
        "devices": {"P0": {"kind": "PPU", "members": ["n0"]}},
        "drivers": [
            {"name": "analyst", "curve_key": keys[2]},
            {"name": "Analyst", "curve_key": keys[3], "code": "kernels"},
        ],
    }
    with pytest.raises(ClusterSpecError, match=r"drivers\[1\]\.name: duplicate"):
        ClusterSpec.from_dict(data)


def _walk() -> int:
    return 1  # stands for a function of a's (a ``code: any`` driver)


def test_an_allowed_drivers_program_with_a_function_in_a_set_opens_beside_a_kernels_entry() -> None:
    """Finding 3 (low: a legit program refused). With any driver listed ``code: kernels``,
    every program opens screened first; one holding a pickle only inside a set (a constant
    ``frozenset({fn})``) was taken for malformed, as ``holds_pickle`` did not look in sets:
    a's program was refused here for every job (a ``ProtocolError``), though a ships code
    here, and opened on the same worker without the entry. Under ``--code kernels`` such a
    program or input was refused as malformed rather than for its code. Fixed:
    ``holds_pickle`` looks in sets too."""
    a, b, node = _sealers()
    builder = GraphBuilder(1)
    (out,) = builder.op("constant", [], ranks=(0,), value=frozenset({_walk}))
    graph = builder.build([out])
    worker = WorkerSeal(node, 0, kernels_drivers=frozenset({"driver:b"}))
    opened, _ = worker.inbound(_program(a, graph))
    assert type(opened) is Program and opened.graph is not None
    assert _runs(worker, _job_of(a, graph.digest)) is None  # a's job runs it
    assert _refused_for_code(_runs(worker, _job_of(b, graph.digest)))  # b's may not
    assert _refused_for_code(_runs(worker, _job_of(b, graph.digest, [frozenset({_walk})])))


def _job_named(driver: Sealer, session: str, job: str, bindings: Any = None) -> tuple[Exec, Any]:
    context = exec_context(session, job, "d", (0,), (0,), 5.0)
    msg = Exec(session, job, "d", (0,), {}, (0,), 5.0)
    return msg, driver.seal(bindings, "node:n0", context, safe=False)


def test_a_sharee_cannot_take_over_the_recipient_of_a_job_the_pool_holds() -> None:
    """Finding 4 (medium; a hostile broker holding a sharee's key). a shares its session
    with b (listed ``code: kernels`` or not). a's job ``j1`` is handed to the job pool
    (``hold``: its sealer is a). b seals a job of its own under the same id in the same
    session, which the broker delivers while a's waits or runs (an honest broker refuses
    a job id in flight; this one does not): it opened, and from then on the worker took b
    for the recipient of a's job too: a's job, starting, ran with b's folder for the file
    kernels (a's files written where b reads them, b's files read as a's), its moves
    carried b, and its Done was sealed for b (a's call never answered).

    Fixed: a job the pool holds for one driver is refused to another under its id, and a
    refused Exec's answer forgets nothing (it cleared the held job's recipient: its Done
    then went to no one)."""
    from mpl.wire.session_word import worded

    a, b, node = _sealers()
    worker = WorkerSeal(node, 0, kernels_drivers=frozenset({"driver:b"}))
    t = worker.admission.started
    first = _job_named(a, "sa", "j1", worded([1], ["driver:a", "driver:b"], t + 1))
    assert _runs(worker, first) == [1]
    assert worker.hold("sa", "j1") == "driver:a"  # handed to the pool
    taken = _runs(worker, _job_named(b, "sa", "j1", worded([2], None)))
    assert type(taken) is Failed
    assert worker.recipient("sa", "j1") == "driver:a"
    worker.outbound(taken)  # the refusal goes out: a's job is not forgotten by it
    assert worker.recipient("sa", "j1") == "driver:a"
    replayed = _runs(worker, first)  # the broker replays a's own box: refused as run
    assert type(replayed) is Failed and type(worker.outbound(replayed)) is Failed
    assert worker.recipient("sa", "j1") == "driver:a"
    assert _runs(worker, _job_named(b, "sa", "j2", worded([3], None))) == [3]  # its own run
    assert worker.recipient("sa", "j1") == "driver:a"
    worker.release("sa", "j1")


def test_another_drivers_copy_that_does_not_open_refuses_no_job_of_a_program_that_did() -> None:
    """Finding 5 (low-medium: a denial of service on a program, by any listed driver that
    knows its digest). a's program opened here and is cached. b seals something that is
    no graph (or does not decode) under that digest, for this rank: the worker recorded the
    digest as refused, and from then on refused every job naming it, a's included ("program
    ... was refused"), though a's copy was cached and the broker never sends a's again (its
    mirror of the worker's cache is keyed by digest). Fixed: a copy that does not open
    refuses nothing of a digest whose program opened here as itself."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    graph = _graph(KernelRef("mpl.io.read_npy"))
    opened, _ = worker.inbound(_program(a, graph))
    assert type(opened) is Program
    context = program_context(graph.digest)
    for junk in (42, {"not": "a graph"}):
        bogus = b.seal_record(junk, "node:n0", context, safe=False)
        assert worker.inbound(Program(graph.digest, None, {0: bogus})) == (None, None)
    assert _runs(worker, _job_of(a, graph.digest)) is None  # a's job still runs
    assert _runs(worker, _job_of(b, graph.digest)) is None  # (and b's, of the same graph)
    fresh = WorkerSeal(node, 0)  # no genuine copy opened yet: refused, saying why
    fresh.inbound(Program(graph.digest, None, {0: b.seal_record(42, "node:n0", context)}))
    refused = _runs(fresh, _job_of(a, graph.digest))
    assert type(refused) is Failed and "was refused" in refused.error.message


def test_each_drivers_copy_of_a_program_goes_to_a_worker() -> None:
    from test_broker_state import W0, W1, hello, sent

    from mpl.broker.state import BrokerState
    from mpl.wire.sessions import OpenSession, SessionOpened

    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    state.handle(W0, hello(0), 0.0)
    state.handle(W1, hello(1), 0.0)
    builder = GraphBuilder(2)
    (out,) = builder.op("pcall", [], ranks=(0,), fn=builder.fn(abs))
    graph = builder.build([out])
    program = Program(graph.digest, graph)
    copies, sids = [], []
    for n, peer in enumerate((b"drv:b/1", b"drv:a/1")):
        opened = state.handle(peer, OpenSession(1, f"s{n}", 60.0, peer.decode()[4:5]), 0.0)
        sids.append(sent(opened, SessionOpened, peer)[0].session)
        state.handle(peer, program, 0.0)
        answer = state.handle(peer, Exec(sids[n], f"j{n}", graph.digest, (0,), {}), 0.0)
        copies.append(len(sent(answer, Program, W0)))
    assert copies == [1, 1]  # b's copy, then a's: a's own opens there
    # the same worker process from a new socket keeps its cache: neither copy goes again
    state.handle(b"w0b", hello(0), 0.0)
    for n, peer in enumerate((b"drv:b/1", b"drv:a/1", b"drv:b/1")):
        answer = state.handle(peer, Exec(sids[n % 2], f"k{n}", graph.digest, (0,), {}), 0.0)
        assert sent(answer, Exec, b"w0b") and not sent(answer, Program)
