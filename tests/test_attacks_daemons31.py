"""Closed findings of rounds 29-30, their attacks sent through real daemons (w31-sec, item 4).

Their first tests drove the pure cores or the seal; here each attack goes over sockets to
real ``mpl-worker`` processes (and an ``mpl-broker`` process, or a broker in this process
whose ROUTER a tap stands in for: a hostile broker operator), holding the attacker's own
key, and each test checks the daemons still serve and nothing leaked or changed:

- a listed driver's jobs reach another driver's files through the file kernels (red team
  findings 10 and 11, review w30-policy finding 1, and w31's link and quota rules);
- a junk program under another driver's digest (review w30-policy finding 5, the broker's
  mirror keyed by driver and the worker's copy kept);
- a hostile broker's ``DeleteSymbol`` of a persisted file without an owner (finding 2);
- a party's worker failing a job in another rank's name (finding 8);
- a broker holding a sharee's key sealing a job under the id of one the job pool holds
  for the session's owner (review w30-policy finding 4).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import compact_box, wait_until
from test_authz_daemons import Raw, impostor
from test_replay_restart import Rig

import mpl.driver as mp
from mpl.wire import GraphBuilder
from mpl.wire.codec import decode, from_wire
from mpl.wire.incarnation import public_incarnation
from mpl.wire.jobs import Exec, Failed, JobResult, Lit, Program
from mpl.wire.kernels import KernelRef
from mpl.wire.keys import load_keypair
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.seal import Sealer, exec_context
from mpl.wire.session_word import worded
from mpl.wire.sessions import Ack, DeleteSymbol, SymbolInfo
from mpl.worker.symbol_disk import SymbolDisk

pytestmark = pytest.mark.daemons


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster listing the analyst and mallory (another organisation's driver,
    or the broker operator's), the broker tapped; workers are started by each test."""
    made = Rig(tmp_path / "rig", drivers=("analyst", "mallory"))
    try:
        yield made
    finally:
        made.close()


def _remote(fn: Any) -> mp.RemoteError:
    with pytest.raises(mp.RemoteError) as info:
        fn()
    return info.value


def test_a_drivers_kernels_reach_no_other_drivers_files_on_real_workers(rig: Rig) -> None:
    """mallory's jobs call ``mpl.io.*`` on real secure workers to read, replace or bury
    the analyst's files: by ``..``, by the drivers' folder's name in any case, by the
    persisted values' folder, through a symbolic link in its own folder (as an operator's
    kernel could leave one, or swap one in), and by filling the disk. Each is refused, the
    analyst's files stay whole, and both drivers' jobs still run."""
    quota = 256 * 1024
    rig.start_worker(0, extra=["--driver-quota", str(quota)])
    rig.start_worker(1)
    data0 = rig.d.root / "data0"
    read_npy, write_npy = mp.kernel("mpl.io.read_npy"), mp.kernel("mpl.io.write_npy")
    with rig.connect() as analyst, rig.connect("mallory") as mallory:
        with analyst:
            mp.fetch(mp.device("P0")(write_npy)("out.npy", np.array([4.0, 2.0])))
        theirs = data0 / "drivers" / "analyst" / "out.npy"
        assert np.load(theirs).tolist() == [4.0, 2.0]
        (data0 / "drivers" / "mallory").mkdir()
        (data0 / "drivers" / "mallory" / "peek").symlink_to(
            data0 / "drivers" / "analyst", target_is_directory=True
        )
        with mallory:
            for path in (
                "../analyst/out.npy",
                "drivers/analyst/out.npy",
                "Drivers/analyst/out.npy",
                "symbols/kept.sym",
                "peek/out.npy",
                str(theirs),
            ):
                error = _remote(lambda p=path: mp.fetch(mp.device("P0")(read_npy)(p)))
                assert error.remote_type == "PermissionError", (path, error)
            for path in ("../analyst/out.npy", "peek/out.npy", "peek/new.npy", str(theirs)):
                error = _remote(lambda p=path: mp.fetch(mp.device("P0")(write_npy)(p, np.zeros(2))))
                assert error.remote_type == "PermissionError", (path, error)
            error = _remote(lambda: mp.fetch(mp.device("P0")(read_npy)("out.npy")))
            assert error.remote_type == "FileNotFoundError"  # its own folder has none
            big = np.zeros(quota // 8)  # its header makes it one block too many
            error = _remote(lambda: mp.fetch(mp.device("P0")(write_npy)("big.npy", big)))
            assert error.remote_type == "DriverQuotaError", error
            assert f"quota of {quota} bytes" in error.remote_message and error.rank == 0
            saved = mp.device("P0")(write_npy)("mine.npy", np.array([1.0]))
            assert mp.fetch(mp.device("P0")(read_npy)(saved)).tolist() == [1.0]
        assert sorted(os.listdir(data0 / "drivers" / "mallory")) == ["mine.npy", "peek"]
        assert np.load(theirs).tolist() == [4.0, 2.0]
        with analyst:
            back = mp.device("P0")(read_npy)("out.npy")
            assert mp.fetch(back).tolist() == [4.0, 2.0]


def test_a_junk_program_under_another_drivers_digest_stops_none_of_its_jobs(rig: Rig) -> None:
    """mallory seals a program of its own under the digest of one the analyst is about to
    run (digests of common programs are no secret) and runs a job of it first: the
    worker refuses the junk. The broker's mirror must still send the analyst's own copy
    (it is keyed by driver and digest: before, it took the worker to hold the digest and
    sent nothing, and the analyst's jobs failed "cannot load the program here"), and junk
    sent after the genuine copy must not replace it on the worker (a job naming a digest
    runs the graph of that digest, whoever names it: programs hold no secret)."""
    rig.start_worker(0)
    rig.start_worker(1)
    b = GraphBuilder(2)
    genuine = b.build([b.op("constant", [], ranks=(0,), value="genuine")[0]])
    b = GraphBuilder(2)
    junk = b.build([b.op("constant", [], ranks=(0,), value="forged")[0]])
    junk.__dict__["digest"] = genuine.digest  # mallory's own graph, the analyst's digest
    with rig.connect() as analyst, rig.connect("mallory") as mallory:
        with pytest.raises(mp.MplError):
            mallory.client.submit(mallory.session, junk, {})
        result = analyst.client.submit(analyst.session, genuine, {}, inline=(0,))
        assert result.values[0] == {0: "genuine"}
        try:  # its junk never runs: its digest names the analyst's graph on the worker
            got = mallory.client.submit(mallory.session, junk, {}, inline=(0,)).values[0]
        except mp.MplError:
            got = None
        assert got != {0: "forged"}
        again = analyst.client.submit(analyst.session, genuine, {}, inline=(0,))
        assert again.values[0] == {0: "genuine"}
        with analyst:
            assert mp.fetch(mp.device("P1")(lambda: 2)()) == 2


def test_a_hostile_brokers_delete_symbol_leaves_a_file_without_an_owner(rig: Rig) -> None:
    """The broker operator makes its broker send a real worker ``DeleteSymbol`` of a
    persisted value that has no owner (saved before owners, or by a plaintext run): a
    secure worker deletes no file on the broker's word, and this one is no one's to
    delete. Before: the worker took the broker's empty writer for the empty owner and
    deleted it."""
    SymbolDisk(rig.d.root / "data0").save(SymbolInfo("kept", "P0", (0,), True, {}), 7)
    rig.start_worker(0)
    rig.start_worker(1)
    req = 424242

    def inject(msg: Record) -> list[Record] | None:
        if isinstance(msg, Exec):
            rig.tap.alter = None
            return [DeleteSymbol(msg.session, req, "kept", (0,), True), msg]
        return None

    acks: list[Ack] = []
    recv = rig.tap.recv_multipart

    def recv_noting_acks(*args: Any, **kw: Any) -> Any:
        frames = recv(*args, **kw)
        with contextlib.suppress(Exception):
            msg = decode(from_wire([memoryview(f).tobytes() for f in frames[1:]]))
            if isinstance(msg, Ack) and msg.req == req:
                acks.append(msg)
        return frames

    rig.tap.recv_multipart = recv_noting_acks  # type: ignore[method-assign]

    with rig.connect() as analyst, analyst:
        assert mp.fetch(mp.device("P0")(lambda: 4)()) == 4  # the session bound on rank 0
        rig.tap.alter = inject
        assert mp.fetch(mp.device("P0")(lambda: 5)()) == 5
        wait_until(lambda: acks, 15, "the worker's answer to the DeleteSymbol")
        assert acks[0].error is not None and acks[0].error.rank == 0, acks
        assert SymbolDisk(rig.d.root / "data0").load("kept") == 7  # still there, whole
        assert mp.fetch(mp.device("P0")(lambda: 6)()) == 6


def test_a_partys_worker_cannot_fail_a_job_in_another_ranks_name(make_cluster: Any) -> None:
    """A raw socket registered as rank 2 (the party's own worker, rewritten) answers a job
    of ranks 0 and 2 with a ``Failed`` whose error names rank 0, to a real ``mpl-broker``:
    the driver must read the refusal as rank 2's (a driver reads the refusing rank from
    the error, to seal for that rank's process again), and the broker counts the lie."""
    cluster = make_cluster("tcp", world_size=3)
    watcher = cluster.client()
    zctx: zmq.Context[Any] = zmq.Context()
    try:
        attacker, _ = impostor(cluster, zctx, 2)
        victim = Raw(zctx, cluster.address)
        sid = victim.open_session("victim")
        b = GraphBuilder(3)
        ours = b.op("constant", [], ranks=(0,), value=0)[0]
        theirs = b.op("constant", [], ranks=(2,), value=2)[0]
        graph = b.build([ours, theirs])
        forged_before = watcher.status()["forged_replies"]
        victim.send(Program(graph.digest, graph))
        victim.send(Exec(sid, "victim-job", graph.digest, (0, 2), {}, ()))
        attacker.wait_for(lambda m: isinstance(m, Exec) and m.job == "victim-job")
        lie = ErrorInfo("RemoteError", "rank 0 refuses this job", rank=0)
        attacker.send(Failed(sid, "victim-job", 2, lie))
        result = victim.wait_for(lambda m: isinstance(m, JobResult) and m.job == "victim-job")
        assert isinstance(result, JobResult) and result.error is not None
        assert result.error.rank == 2, f"rank 2 spoke for rank {result.error.rank}"
        assert watcher.status()["forged_replies"] == forged_before + 1
        sid2 = watcher.open_session().session
        b = GraphBuilder(3)
        g = b.build([b.op("constant", [], ranks=(0,), value=5)[0]])
        assert watcher.submit(sid2, g, {}, inline=(0,)).values[0] == {0: 5}
    finally:
        zctx.destroy(linger=0)


_KERNELS = '''
import os
import time

import numpy as np

from mpl.worker.kernel_table import driver_root


def wait_for(flag):
    """Wait (at most 60 s) for the file ``flag``: the session's next jobs queue behind."""
    end = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < end:
        time.sleep(0.01)
    return 0


def write_out(tag):
    """Write out.npy in the job's driver's folder: whose job the worker took it for."""
    folder = driver_root()
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "out.npy", np.array([1.0]))
    return 1
'''


def _kernel_job(name: str) -> Any:
    b = GraphBuilder(2)
    (out,) = b.op("pcall", [b.input((0,))], ranks=(0,), fn=b.fn(KernelRef(f"kernels31:{name}")))
    return b.build([out])


def test_a_sharee_key_broker_cannot_take_over_a_job_the_pool_holds(
    rig: Rig, tmp_path: Path
) -> None:
    """Review w30-policy finding 4 (medium), on real workers. The analyst shares its
    session with mallory, whose key the broker's operator holds. The analyst's job waits
    in P0's job pool behind another of its jobs (which blocks until a flag file exists);
    right behind its Exec the broker sends P0 a job mallory sealed under the same job id,
    in the same session, which an honest broker would refuse as in flight. Before the fix
    the worker then took mallory for the recipient of the analyst's job: the job ran with
    mallory's folder for its files (and its Done was sealed for mallory). Now the forged
    Exec is refused and the analyst's job writes in the analyst's folder."""
    rig.d.add_module("kernels31", _KERNELS)
    rig.start_worker(0, extra=["--kernels", "kernels31"])
    rig.start_worker(1)
    flag = tmp_path / "go"
    keys = load_keypair(rig.d.key("mallory"))
    nodes = {f"node:node{r}": rig.d.spec.nodes[r].curve_key for r in range(2)}
    mallory_seals = Sealer(keys.secret, "driver:mallory", nodes)
    blocking, writing = _kernel_job("wait_for"), _kernel_job("write_out")
    forged: list[Exec] = []

    def add_forgery(msg: Record) -> list[Record] | None:
        if not (isinstance(msg, Exec) and msg.digest == writing.digest and 0 in msg.bindings):
            return None
        rig.tap.alter = None
        hello = rig.broker.state.registry.by_rank[0].hello
        context = exec_context(
            msg.session,
            msg.job,
            msg.digest,
            msg.ranks,
            msg.inline,
            msg.timeout_s,
            public_incarnation(hello.incarnation),
        )
        word = worded([Lit("m")], None)  # a member's word: no say, as mallory's is
        box = mallory_seals.seal(word, "node:node0", context, safe=False)
        forged.append(dataclasses.replace(msg, bindings={0: compact_box(box)}))
        return [msg, forged[0]]

    def refusals() -> list[Failed]:
        got = [m for m in rig.tap.received if isinstance(m, Failed)]
        return [m for m in got if forged and m.job == forged[0].job and m.rank == 0]

    analyst = rig.connect(share_with=["mallory"])
    try:
        with analyst:
            mp.fetch(mp.device("P0")(lambda: 0)())  # the session bound on P0, mallory listed
        rig.tap.alter = add_forgery
        first = analyst.client.submit_async(analyst.session, blocking, {0: [Lit(str(flag))]})
        second = analyst.client.submit_async(analyst.session, writing, {0: [Lit("a")]})
        wait_until(lambda: forged, 20, "the analyst's job and the forgery sent to P0")
        with contextlib.suppress(AssertionError):  # the base answered none: see the file
            wait_until(refusals, 10, "P0's refusal of the forgery")
        flag.write_text("go")
        assert first.result(60) is not None
        with contextlib.suppress(mp.MplError):  # the refusal may fail the analyst's call
            second.result(60)
        drivers = rig.d.root / "data0" / "drivers"
        wait_until(lambda: list(drivers.glob("*/out.npy")), 60, "the job's file")
        folders = [p.parent.name for p in drivers.glob("*/out.npy")]
        assert folders == ["analyst"], f"the analyst's job ran as {folders}'s"
        assert "another driver's job" in refusals()[0].error.message
        with analyst:
            assert mp.fetch(mp.device("P0")(lambda: 7)()) == 7
    finally:
        flag.write_text("go")
        analyst.close()
