"""Review w30 (red team) of secure mode at 6010789: attacks by a hostile broker whose
operator holds a listed driver key (driver b), a hostile party, or an outsider, each
written against the pure cores or real daemons. A finding fixed on this branch has its
test passing; one left to its module's owner is a strict xfail saying what to change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fractions
import os
import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import wait_until
from test_replay_restart import Rig
from test_session_driver_binding import (
    _fetched_by,
    _job,
    _runs,
    _sealers,
    _value_on,
    recorded_replies,
)

import mpl.driver as mp
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.control import WorkerHello
from mpl.wire.data import Fetch
from mpl.wire.errors import AuthenticationError, SessionAccessError
from mpl.wire.jobs import Abort, Done, Exec, Failed, JobResult, Program, output_uri
from mpl.wire.limits import check_symbol_name
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.replay import UNKNOWN_STREAM, refusal_facts
from mpl.wire.routing import check_driver_name
from mpl.wire.seal import Sealer, exec_context, fetch_context
from mpl.wire.sessions import OpenSession, Reply, SessionClosed, SessionOpened, SymbolInfo
from mpl.worker import io_kernels
from mpl.worker.admission import SessionAdmission
from mpl.worker.kernel_table import _DATA_ROOT, KernelTable
from mpl.worker.sealing import WorkerSeal
from mpl.worker.symbol_disk import SymbolDisk


def _repeat_of(driver: Sealer, last: Exec, job: str) -> Any:
    """``driver``'s sealed None for job ``job`` of ``last``'s program (a repeat: the worker
    reads it against ``last``, the same record each time, as ``RepeatExecs.last``)."""
    context = exec_context(last.session, job, last.digest, last.ranks, last.inline, last.timeout_s)
    return driver.seal(None, "node:n0", context, safe=False)


@pytest.mark.parametrize("close", ["one", "all"])
def test_a_forged_close_is_undone_by_the_owners_next_short_path_job(close: str) -> None:
    """Finding 1 (high). a runs one program again and again in "sa" (sealed Nones: the
    worker's short path, ``WorkerSeal.open_exec``, which caches the last Exec's context
    with the driver whose session it checked). The broker forges "sa"'s close on the
    worker: the binding becomes evictable and "sa" leaves ``solo``. a's next job arrives
    as a repeat of the same Exec record: the cached context skips the ``solo`` lookup, so
    the job runs without the full path that un-closes the session. (On a daemon the job
    state refuses a closed session's jobs only while it remembers the close: an LRU of
    1,024, which the broker flushes with forged closes of other ids.) a's values are made
    in a session still closed; the broker's driver b binds sessions of its own until the
    worker evicts "sa", binds "sa" itself and has a's value fetched for b. (The short
    path serves ``--code any`` workers only, where finding 5 lets a listed driver read
    more directly; by the admission's own rules, and for any per-driver code policy, it
    is a leak.)

    Fixed: a close (one session, or all) clears the cached context, so the next job takes
    the ``solo`` lookup and the full path, which un-closes the session."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    worker.admission = SessionAdmission(limit=2)  # the bound, made small (20,000 real)
    worker._solo = worker.admission.solo
    last = Exec("sa", "j0", "d", (0,), {}, (0,), 5.0)
    for job in ("a1", "a2", "a3"):  # full path, then the short path (context cached)
        assert worker.open_exec(last, job, _repeat_of(a, last, job)) is None
    if close == "one":
        worker.inbound(SessionClosed("sa", "forged by the broker"))
    else:  # a new broker (or the same, saying it is new) welcomed the worker
        worker.all_closed()
    assert worker.open_exec(last, "a4", _repeat_of(a, last, "a4")) is None  # a's next job
    for own in ("m1", "m2"):  # b's own sessions: the second evicts "sa" if still closed
        _runs(worker, _job(b, own))
    worker.inbound(SessionClosed("m1", "b's own, closed: room for one"))
    took = _runs(worker, _job(b, "sa")) is None  # b binds "sa" to itself
    assert not (took and _fetched_by(worker, b, "sa", "a4/0") is not None), "a's value for b"
    assert "sa" in worker.admission.solo  # a's, in use: un-closed


def test_the_brokers_delete_symbol_deletes_no_file_without_an_owner(tmp_path: Path) -> None:
    """Finding 2 (low). A secure worker holds a file without an owner (persisted by an mpl
    before owners, or by the same data root run in plaintext): README, "no one's on a secure
    worker: neither read, replaced nor deleted", and "a DeleteSymbol deletes no file on a
    secure worker (refused while the file is there)". The broker's ``DeleteSymbol`` is
    ``SymbolDisk.delete(name, "")`` there (``Jobs._unsave``), and ``refuse_write`` let
    writer "" delete owner "" (``owner == writer``): the broker destroyed the file its
    operator was to hand back to its owner. Fixed: only a named writer matches an owner."""
    SymbolDisk(tmp_path).save(SymbolInfo("kept", "", (0,), True, {}), 7)  # no owner
    disk = SymbolDisk(tmp_path)
    with pytest.raises(SessionAccessError):
        disk.delete("kept", "")  # the broker's word, as a secure worker's _unsave gives it
    assert disk.load("kept") == 7  # still there, whole


class _Planted:
    """A value whose unpickling creates a directory: code a hostile broker ships."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


@pytest.mark.daemons
def test_a_hostile_broker_cannot_make_a_trusted_secure_driver_unpickle(tmp_path: Path) -> None:
    """Finding 3 (medium). A cluster of one organisation declares ``trusted: true`` so that
    values between its parties may be pickles; it still runs secure mode, whose broker is
    not trusted: ``pickles_allowed(BROKER, trusted=True, secure=True)`` is False ("trusted
    never lets an untrusted broker ship code"), and the worker decodes the broker's clear
    traffic so. The driver did not: ``Client.safe`` is worked out from ``trusted`` alone
    (the WORKER rule), and every answer the broker sends (an open's ``SessionOpened``, a
    ``JobResult``'s header) was decoded with pickles allowed. The broker's operator put a
    pickle in ``SessionOpened`` and ran code in the driver's process at ``mp.connect``.
    Fixed: a secure driver decodes what the broker sends in the safe format; sealed values
    are opened (and unpickled, where trusted) only once a worker's seal authenticated."""
    rig = Rig(tmp_path / "rig")
    planted = tmp_path / "planted"

    def plant(msg: Record) -> list[Record] | None:
        if isinstance(msg, SessionOpened):
            rig.tap.alter = None
            return [dataclasses.replace(msg, cluster={**msg.cluster, "x": _Planted(str(planted))})]
        return None

    try:
        rig.tap.alter = plant
        with contextlib.suppress(mp.MplError), rig.connect(trusted=True):
            pass
    finally:
        rig.close()
    assert not planted.exists(), "the broker's pickle ran in the driver"


@pytest.mark.daemons
def test_a_hostile_broker_cannot_make_a_trusted_secure_drivers_pump_unpickle(
    tmp_path: Path,
) -> None:
    """Finding 3, on the job pump's path (``submit_async``: jobs in flight), which worked
    out its own ``safe`` from ``trusted`` alone: the broker puts a pickle in a
    ``JobResult``'s header and the pump thread loads it. Fixed with the client's rule."""
    rig = Rig(tmp_path / "rig")
    planted = tmp_path / "planted"

    def plant(msg: Record) -> list[Record] | None:
        if isinstance(msg, JobResult):
            rig.tap.alter = None
            metas: dict[int, Any] = {0: _Planted(str(planted))}  # where a str belongs
            return [dataclasses.replace(msg, metas=metas)]
        return None

    try:
        rig.start_worker(0)
        with rig.connect(trusted=True) as ctx:
            builder = GraphBuilder(ctx.cluster.world_size)
            graph = builder.build([builder.op("constant", [], ranks=(0,), value=1)[0]])
            rig.tap.alter = plant
            future = ctx.client.submit_async(ctx.session, graph, {}, inline=(0,), timeout=3)
            with contextlib.suppress(Exception):
                future.result(timeout=10)
    finally:
        rig.close()
    assert not planted.exists(), "the broker's pickle ran in the driver's pump"


@pytest.mark.daemons
def test_a_trusted_secure_driver_still_reads_pickled_results(tmp_path: Path) -> None:
    """Finding 3's fix keeps what ``trusted: true`` is for: a worker's pickled result
    (a small one, a compact box; a large one, a ``Sealed`` record) reaches the trusted
    secure driver, unpickled by the seal after it authenticated."""
    rig = Rig(tmp_path / "rig")
    try:
        proc = rig.d.start_worker(0, extra=["--trusted"], name="worker0-trusted")
        wait_until(lambda: rig.serving(0) == proc.pid, 30, "worker 0 to register")
        with rig.connect(trusted=True):
            small = mp.device("P0")(lambda: fractions.Fraction(1, 3))
            large = mp.device("P0")(lambda: [fractions.Fraction(i, 7) for i in range(4000)])
            assert mp.fetch(small()) == fractions.Fraction(1, 3)
            assert mp.fetch(large())[-1] == fractions.Fraction(3999, 7)
    finally:
        rig.close()


def test_another_drivers_jobs_do_not_push_out_a_running_jobs_recipient() -> None:
    """Finding 4 (low: a denial of service by a party, not only by the broker). a's job
    runs long on the worker; b (any listed driver, in a session of its own) sends 4,097
    jobs meanwhile, each opened and booked as the newest. a's job's recipient was the
    oldest entry and went: its Done fails "no authenticated driver here to seal its results
    for". Fix: book a job's recipient until its Done or Failed (or Abort) is sealed, bounded
    by the jobs this worker holds (a refused job is never booked), or keep the bound per
    driver, so one driver's jobs push out only its own. Fixed by w30-worker: the job shell
    holds a pooled job's recipient (``WorkerSeal.hold``) until its answer is sealed."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    long_job = _job(a, "sa", [1])
    assert _runs(worker, long_job) == [1]
    # a long job goes to the job pool, and the job shell holds its recipient there
    assert worker.hold("sa", long_job[0].job) == "driver:a"
    for _ in range(4097):
        assert _runs(worker, _job(b, "sb")) is None
    done = worker.outbound(Done("sa", long_job[0].job, 0, {0: 5}))
    assert type(done) is Done, done


def _own_spec(rig: Rig, **codes: str) -> Path:
    """A node's own copy of the rig's spec, its drivers listed with ``codes`` (name ->
    ``code:``), written beside the shared one."""
    data = rig.d.spec.to_dict()
    for entry in data["drivers"]:
        if entry["name"] in codes:
            entry["code"] = codes[entry["name"]]
    path = rig.d.root / f"own-{len(list(rig.d.root.glob('own-*.yaml')))}.yaml"
    path.write_text(ClusterSpec.from_dict(data).to_yaml())
    return path


@pytest.mark.daemons
def test_a_listed_drivers_code_reads_no_value_of_another_drivers_session(
    tmp_path: Path,
) -> None:
    """Finding 5 (high, a gap in the stated trust model). The rules of "Who may do what"
    (sessions belong to drivers, a fetch is sealed only for a driver the session admits,
    a persisted value is read only in its owner's sessions) are kept by the worker's code
    around the jobs; but on a worker with ``--code any`` a job is any function its driver
    ships, run in that same process. mallory (a listed driver: the broker's operator, say)
    runs a function on P0 that walks its threads' frames to the store and returns the
    analyst's value from the analyst's private session.

    Fixed: a node's own spec says per driver whether it may ship code (``drivers: [{name,
    curve_key, code: kernels}]``), enforced by the job's authenticated sealer: the parties
    list mallory (another organisation's driver) as kernels-only, and its function is
    refused unloaded (``RemotePermissionError``) while the analyst's code runs on the
    same ``--code any`` workers, and mallory's named kernels run too."""
    rig = Rig(tmp_path / "rig", drivers=("analyst", "mallory"))
    secret = 918273645

    def steal() -> list[int]:  # a closure: travels by value, as a user's function would
        import sys

        from mpl.worker.store import ObjectStore

        found: list[int] = []
        for top in sys._current_frames().values():  # the worker's threads, to their roots
            frame: Any = top
            while frame is not None:
                for local in list(frame.f_locals.values()):
                    store = getattr(local, "store", None)
                    if type(store) is ObjectStore:
                        for jobs in store._outputs.values():
                            found += [v for v in jobs.values() if type(v) is int]
                frame = frame.f_back
        return found

    write_npy, read_npy = mp.kernel("mpl.io.write_npy"), mp.kernel("mpl.io.read_npy")
    try:
        own = _own_spec(rig, mallory="kernels")
        rig.start_worker(0, cluster=own)
        rig.start_worker(1, cluster=own)
        with rig.connect() as analyst, rig.connect("mallory") as mallory:
            with analyst:
                kept = mp.device("P0")(lambda: secret)()  # stays on P0, in its session
            with mallory:
                with pytest.raises(PermissionError, match="code: kernels"):
                    mp.fetch(mp.device("P0")(steal)())
                saved = mp.device("P0")(write_npy)("mine.npy", np.array([1.0, 2.0]))
                assert mp.fetch(mp.device("P0")(read_npy)(saved)).tolist() == [1.0, 2.0]
            assert (rig.d.root / "data0" / "drivers" / "mallory" / "mine.npy").is_file()
            with analyst:
                assert mp.fetch(kept) == secret  # the analyst's own code still runs here
    finally:
        rig.close()


def test_a_fetchs_value_is_sealed_by_that_fetchs_session_not_a_later_one_of_its_req() -> None:
    """Finding 6 (high). a's fetch F1 (req 7) of its job's output waits on the worker: its
    session's task queue holds it behind a's long job (a fetch of a value not stored yet is
    a session task). The broker sends 4,096 more fetches that wait too (in a's session,
    behind the same job): ``_fetches`` (an LRU) dropped F1. It then sends F2, req 7 again, in
    b's session "sb" (bound to b, the broker's driver; F2 waits behind a job of b's that
    blocks: a move the broker withholds) with ``reply_to`` b. a's job ends; F1's task reads
    a's value and posts ``Reply(7, value)``; ``outbound`` popped req 7, found F2, checked
    that "sb" admits b, and sealed a's value for b under F2's context, which b opened.

    Fixed: the job shell hands the seal the Fetch it read with the value that answers it
    (``WorkerSeal.reply``): the value is sealed by F1's session, driver and ticket, and no
    table keyed by the broker's number is left to confuse; a Reply with a value that did
    not come so is sent as an error."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    assert _runs(worker, _job(a, "sa", [1])) == [1]  # a's session, bound to a
    assert _runs(worker, _job(b, "sb", [2])) == [2]  # b's own
    first = Fetch("sa", 7, 0, "a-job/0", "driver:a", "a's ticket")
    assert worker.inbound(first) == (first, None)  # waits behind a's long job
    for req in range(1000, 1000 + 4096):  # wait too (and pushed F1 out of the old table)
        forged = Fetch("sa", req, 0, f"x{req}/0", "driver:a", "t")
        assert worker.inbound(forged) == (forged, None)
    second = Fetch("sb", 7, 0, "b-job/0", "driver:b", "b's ticket")
    worker.inbound(second)  # waits behind b's blocked job
    # F1's task: a's value, as the job shell answers F1 (the Fetch it read)
    reply = worker.outbound(worker.reply(first, "a's secret"))
    assert isinstance(reply, Reply) and reply.error is None
    with pytest.raises(AuthenticationError):
        b.open(reply.value, fetch_context("sb", 0, "b-job/0", "b's ticket"), sender="node:n0")
    context = fetch_context("sa", 0, "a-job/0", "a's ticket")
    assert a.open(reply.value, context, sender="node:n0")[1] == "a's secret"  # F1's, for a
    # the reviewer's step: a's value posted by req alone is sealed for no one, nor sent
    plain = worker.outbound(Reply(7, "a's secret"))
    assert type(plain) is Reply and plain.value is None and plain.error is not None


def _blocks_until(flag: str, result: str) -> Any:
    """A job's function that returns ``result`` once file ``flag`` exists (at most 60 s)."""

    def blocked() -> str:
        import os
        import time

        end = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < end:
            time.sleep(0.01)
        return result

    return blocked


@pytest.mark.daemons
def test_a_fetchs_value_is_sealed_by_that_fetchs_session_on_a_worker(tmp_path: Path) -> None:
    """Finding 6 against a real worker, by a hostile broker (the tap) whose operator holds
    mallory's key. mallory's job blocks on P0 (its session's tasks wait behind it). The
    analyst's job runs long on P0; after its Exec the broker sends the fetch F1 of its
    output (req R, for the analyst: it waits behind the job), 4,096 fetches that wait too,
    then F2 of mallory's job's output with req R again, for mallory, and a fetch of a held
    value (answered at once: the worker read all before it). The analyst's job ends: F1's
    reply must be sealed for the analyst under F1's context, never for mallory under F2's
    (the base sealed it so: mallory opened the analyst's value)."""
    rig = Rig(tmp_path / "rig", drivers=("analyst", "mallory"))
    replies: list[Reply] = recorded_replies(rig)
    analyst_go, mallory_go = str(tmp_path / "analyst-go"), str(tmp_path / "mallory-go")
    secret, req = "the analyst's long job's secret", 987_654_321
    try:
        rig.start_worker(0)
        rig.start_worker(1)
        with rig.connect() as owner, rig.connect("mallory") as mallory:
            held = _value_on(owner, 0, "held")
            mallorys: list[Exec] = []
            sent: list[Fetch] = []

            def seen(msg: Any) -> list[Any] | None:  # mallory's blocking job, on its way
                if isinstance(msg, Exec) and msg.session == mallory.session:
                    rig.tap.alter = None
                    mallorys.append(msg)
                return None

            def fetches(msg: Any) -> list[Any] | None:  # after the analyst's job: the fetches
                if isinstance(msg, Exec) and msg.session == owner.session and 0 in msg.bindings:
                    rig.tap.alter = None
                    first = Fetch(
                        owner.session, req, 0, output_uri(msg.job, 0), "driver:analyst", "a"
                    )
                    more = [
                        Fetch(
                            owner.session,
                            req + 10 + i,
                            0,
                            output_uri("gone", i),
                            "driver:analyst",
                            "t",
                        )
                        for i in range(4096)
                    ]
                    mine = output_uri(mallorys[0].job, 0)
                    second = Fetch(mallory.session, req, 0, mine, "driver:mallory", "m")
                    last = Fetch(owner.session, req + 1, 0, held, "driver:analyst", "h")
                    sent.extend([first, second])
                    return [msg, first, *more, second, last]
                return None

            def graph(flag: str, result: str) -> Any:
                b = GraphBuilder(2)
                return b.build(
                    [b.op("pcall", [], ranks=(0,), fn=b.fn(_blocks_until(flag, result)))[0]]
                )

            rig.tap.alter = seen
            blocked = mallory.client.submit_async(mallory.session, graph(mallory_go, "m"), {})
            wait_until(lambda: mallorys, 20, "mallory's job sent to P0")
            rig.tap.alter = fetches
            long_job = owner.client.submit_async(owner.session, graph(analyst_go, secret), {})
            wait_until(
                lambda: [r for r in replies if r.req == req + 1], 60, "the last fetch's reply"
            )
            Path(analyst_go).write_text("go")
            assert long_job.result(60) is not None
            (reply,) = wait_until(lambda: [r for r in replies if r.req == req], 60, "F1's reply")
            first, second = sent
            read = None
            if reply.error is None:
                with contextlib.suppress(AuthenticationError):
                    read = mallory.client.seal.fetched(  # type: ignore[union-attr]
                        second.session, 0, second.uri, second.ticket, reply.value
                    )
            assert read != secret, "the analyst's value sealed for mallory"
            assert reply.error is None, reply.error
            opened = owner.client.seal.fetched(  # type: ignore[union-attr]
                first.session, 0, first.uri, first.ticket, reply.value
            )
            assert opened == secret  # F1's reply, for the analyst under F1's context
            Path(mallory_go).write_text("go")
            assert blocked.result(60) is not None
    finally:
        Path(analyst_go).write_text("go")
        Path(mallory_go).write_text("go")
        rig.close()


def test_an_outsider_cannot_make_the_metrics_port_start_a_thread_per_connection() -> None:
    """Finding 7 (low; an outsider, where the metrics port is reachable). The metrics
    server (``mpl.wire.httpd``, every daemon's ``--metrics-port``, whose clients nobody
    authenticates) starts a thread per connection; its bound (8) is on requests served at
    once, checked only once a request line arrived. Connections that send nothing each
    hold a thread for the 10 s client timeout, however many there are, and are renewed as
    fast as they time out. Fixed: at most ``_MAX_CONNECTIONS`` connections have a thread;
    one past them is closed at once."""
    from prometheus_client import CollectorRegistry

    from mpl.wire import httpd

    server = httpd.MetricsServer(CollectorRegistry())
    before = set(threading.enumerate())

    def connection_threads() -> int:
        # the server's own: threads of earlier tests may end (or start) meanwhile, so the
        # process's thread count is no measure. ThreadingMixIn names each of its threads
        # after its target, as threading does for every unnamed thread.
        return sum(
            1
            for t in threading.enumerate()
            if t not in before and t.name.endswith("(process_request_thread)")
        )

    opened = [socket.create_connection((server.host, server.port)) for _ in range(64)]
    try:
        for sock in opened:
            sock.settimeout(0.01)

        def closed_by_server(sock: socket.socket) -> bool:
            try:
                return sock.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                return False

        gone: set[int] = set()

        def settled() -> bool:
            gone.update(i for i, s in enumerate(opened) if i not in gone and closed_by_server(s))
            return connection_threads() + len(gone) >= len(opened)

        wait_until(settled, 15, "every connection to get a thread or be closed")
        assert connection_threads() <= 32
    finally:
        for sock in opened:
            sock.close()
        server.close()


def test_a_workers_failure_speaks_only_for_its_own_rank() -> None:
    """Finding 8 (low: a denial of service by a party). The broker checks that a Failed's
    rank is the sender's, then hands its ``error`` to the driver as it came. The driver's
    ``DriverSeal.refused`` reads the refusing rank from ``error.rank``. Rank 1's worker (a
    party, in a job with rank 0) answers every such job with a stream refusal "from rank 0"
    naming an incarnation and floor it chose: the driver seals rank 0's next job for a
    process that does not exist (refused: one lost job per forgery, jobs of rank 0 alone
    too), and raises its epochs for node 0 to the floor given; with floors near 2**63 and
    1,024 streams evicted at rank 0, every new client of the driver is refused there until that
    worker restarts. Fixed (broker, ``_on_failed``): the error goes on with the rank the
    broker checked, the Failed's (counted in ``forged_replies`` when it named another):
    the job still fails at once, as rank 1 said, and the driver renews nothing for rank 0."""
    spec = ClusterSpec.simple(2, enable_spu=False)
    state = BrokerState(spec, now=0.0, broker_id="B")
    for rank, peer in enumerate((b"w0", b"w1")):
        state.handle(peer, WorkerHello(rank, f"s{rank}", 100, "h", f"tcp://x:{rank}", ""), 0.0)
    driver = b"drv:alice/1"
    out = state.handle(driver, OpenSession(1, "", 60.0, "alice"), 0.0)
    sid = next(a.msg.session for a in out if isinstance(a.msg, SessionOpened))
    builder = GraphBuilder(2)
    graph = builder.build([builder.op("constant", [], ranks=(0, 1), value=1)[0]])
    state.handle(driver, Program(graph.digest, graph), 0.0)
    state.handle(driver, Exec(sid, "j", graph.digest, (0, 1), {}), 0.1)
    forged = ErrorInfo(
        "AuthenticationError",
        "refused" + refusal_facts("0" * 16, (1 << 63) - 2),
        rank=0,
        op=UNKNOWN_STREAM,
    )
    forged_before = state.counters["forged_replies"]
    out = state.handle(b"w1", Failed(sid, "j", 1, forged), 0.2)
    (result,) = [a.msg for a in out if isinstance(a.msg, JobResult)]
    assert result.error is None or result.error.rank == 1, "rank 1 spoke for rank 0"
    assert result.error is not None and result.error.message == forged.message
    assert state.counters["forged_replies"] == forged_before + 1
    aborted = [a.peer for a in out if isinstance(a.msg, Abort)]
    assert aborted == [b"w0"]  # the job ends on rank 0 too; rank 1 failed it itself


@pytest.mark.parametrize("check", [check_symbol_name, check_driver_name])
def test_a_name_ending_in_a_newline_is_no_valid_name(check: Any) -> None:
    """Finding 9 (low). Value names and driver names are checked by a pattern anchored
    with ``$``, which also matches before a final newline: ``"model\\n"`` passed as a value
    name (a listed driver persisted a file ``model\\n.sym`` that any listing shows as
    ``model``, beside the owner's own) and ``"alice\\n"`` as a driver name. Fixed: the
    patterns end with ``\\Z``."""
    assert check("model") == "model"
    for bad in ("model\n", "model\r\n", "model\nx"):
        with pytest.raises(ValueError, match=r"bad .* name"):
            check(bad)


def test_a_file_kernel_cannot_replace_another_drivers_persisted_value(tmp_path: Path) -> None:
    """Finding 10 (medium). A worker keeps persisted values under ``<data-root>/symbols``,
    and mpl's file kernels (``mpl.io.write_npy``/``write_csv``, which any listed driver may
    call, under ``--code kernels`` too: the mode where the rules between drivers hold)
    write anywhere under the same data root. mallory's ``write_npy("symbols/model.sym")``
    replaced the analyst's persisted ``model``, which only its owner's sealed jobs may
    replace or delete: the file no longer reads (a denial of service on the owner's data;
    a kernel writing a file of the symbol format would forge one). Fixed: the file kernels
    refuse paths inside the worker's symbols folder, as paths outside the data root."""
    disk = SymbolDisk(tmp_path)
    disk.save(SymbolInfo("model", "", (0,), True, {}), np.arange(3.0), "driver:analyst")
    token = _DATA_ROOT.set(tmp_path)  # as KernelTable runs a kernel on this worker
    try:
        for path in ("symbols/model.sym", "./symbols/../symbols/model.sym", "symbols/x.npy"):
            with pytest.raises(PermissionError):
                io_kernels.write_npy(path, np.zeros(2))
        with pytest.raises(PermissionError):
            io_kernels.read_npy("symbols/model.sym")
    finally:
        _DATA_ROOT.reset(token)
    assert SymbolDisk(tmp_path).load("model", "driver:analyst").tolist() == [0.0, 1.0, 2.0]


def test_a_file_one_driver_wrote_is_not_read_by_another_drivers_kernel(tmp_path: Path) -> None:
    """Finding 11 (medium, by design so far but not stated). The analyst's job (on a
    ``--code kernels`` worker) writes its private result with ``mpl.io.write_npy("out.npy")``;
    mallory's job calls ``mpl.io.read_npy("out.npy")`` on the same worker and gets it back,
    sealed for mallory. ``KernelTable`` set the same data root for every driver's kernel.

    Fixed: on a secure worker each driver (the job's sealer) has a folder of its own under
    the data root for the file kernels (``<data-root>/drivers/<name>/``): its jobs write
    there and read there first; a read falls back to the operator's files at the data root
    itself, never into another driver's folder."""
    (tmp_path / "books.csv").write_text("1,2\n")  # the operator's own file, for every driver
    table = KernelTable(lambda: {}, root=tmp_path, per_driver=True)

    def run(driver: str, kernel: str, *args: Any) -> Any:
        return table.resolve(kernel, "s", f"driver:{driver}")(*args)

    run("analyst", "mpl.io.write_npy", "out.npy", np.array([4.0, 2.0]))
    assert run("analyst", "mpl.io.read_npy", "out.npy").tolist() == [4.0, 2.0]
    with pytest.raises(FileNotFoundError):
        run("mallory", "mpl.io.read_npy", "out.npy")
    for path in ("drivers/analyst/out.npy", "../analyst/out.npy"):
        with pytest.raises(PermissionError):
            run("mallory", "mpl.io.read_npy", path)
    run("mallory", "mpl.io.write_npy", "out.npy", np.zeros(1))  # its own, beside the other
    assert run("analyst", "mpl.io.read_npy", "out.npy").tolist() == [4.0, 2.0]
    for driver in ("analyst", "mallory"):
        assert run(driver, "mpl.io.read_csv", "books.csv").tolist() == [[1.0, 2.0]]
    run("mallory", "mpl.io.write_csv", "books.csv", np.array([[6.0, 6.0]]))  # its own copy
    assert run("analyst", "mpl.io.read_csv", "books.csv").tolist() == [[1.0, 2.0]]
    assert (tmp_path / "books.csv").read_text() == "1,2\n"  # the operator's, untouched
    with pytest.raises(PermissionError, match="no folder"):  # a job no driver is known for
        table.resolve("mpl.io.read_csv", "s", "")("books.csv")


def test_a_plaintext_workers_drivers_share_its_data_root(tmp_path: Path) -> None:
    """Finding 11, plaintext: drivers are not authenticated there (their names are their
    word), so the file kernels keep today's one folder for all of them."""
    table = KernelTable(lambda: {}, root=tmp_path)
    table.resolve("mpl.io.write_npy", "s", "")("out.npy", np.array([3.0]))
    assert (tmp_path / "out.npy").exists()
    assert table.resolve("mpl.io.read_npy", "s", "")("out.npy").tolist() == [3.0]
