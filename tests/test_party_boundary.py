"""What crosses between parties: the safe value format on live workers and drivers, and no
share or private host value inside a program (ARCHITECTURE.md section 6, "Data" and "No
secret in a program")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import zmq
from helpers import Point, add, double, make_point, point_x, stats, wait_until

import mpl.driver as mp
from mpl.wire import GraphBuilder, ProtocolError, RemoteError, encode
from mpl.wire.codec import MAGIC_FRAME, to_wire
from mpl.wire.data import Move
from mpl.wire.errors import UnsafeValueError
from mpl.wire.jobs import Exec, Lit, Program
from mpl.wire.persist import dumps
from mpl.wire.record import Record
from mpl.wire.sessions import SymbolInfo
from mpl.wire.shares import SpuShare, flatten
from mpl.worker.store import SymbolDisk

if TYPE_CHECKING:
    from mpl.driver.simulator import Simulator


class _Marker:
    """A value whose pickle creates a file when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


@pytest.mark.daemons
def test_a_pickle_sent_to_a_data_port_is_counted_and_never_loaded(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    sid = client.open_session().session
    before = stats(client, 1).get("protocol_errors", 0)
    marker = tmp_path / "marker"
    log = (cluster.impl.run_dir / "worker1.log").read_text()
    data_addr = log.split(" data ", 1)[1].split(",", 1)[0]
    ctx = zmq.Context()
    try:
        peer = ctx.socket(zmq.PUSH)  # anyone who can reach the port, not a worker
        peer.linger = 2000
        peer.connect(data_addr)
        # a well-formed move as a worker sends it (magic and header in one frame): refused
        # for its pickle, not as a malformed header
        move = Move(sid, "j", 0, 0, 0, 1, [_Marker(marker)])
        peer.send_multipart(to_wire(encode(move)), copy=False)
        peer.close()
    finally:
        ctx.term()
    wait_until(
        lambda: stats(client, 1).get("protocol_errors", 0) > before, what="rank 1 to count it"
    )
    worker_log = cluster.impl.run_dir / "worker1.log"
    why = "a pickled value arrived where only the safe value format is accepted"
    wait_until(lambda: why in worker_log.read_text(), what="rank 1 to log why")
    assert "malformed header" not in worker_log.read_text()
    assert not marker.exists()
    b = GraphBuilder(2)  # and it keeps serving moves
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(double), args=(21,))[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
    assert client.submit(sid, b.build([y]), {}, inline=(0,), timeout=10).values[0] == {1: 42}


@pytest.fixture(params=["sim", "procs"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _context(kind: str, tmp_path: Path, trusted: bool | None) -> mp.Context:
    if kind == "sim":
        sim: mp.Context = mp.Simulator.simple(2, enable_spu=False, trusted=trusted)
        return sim
    cluster: mp.Context = mp.local_cluster(
        mp.ClusterSpec.simple(2, enable_spu=False), trusted=trusted, run_dir=tmp_path / "lc"
    )
    return cluster


def test_a_user_class_is_refused_at_the_sender_unless_trusted(kind: str, tmp_path: Path) -> None:
    ctx = _context(kind, tmp_path, None)  # the default: not trusted
    with contextlib.closing(ctx), ctx:
        p = mp.device("P0")(make_point)(7)
        with pytest.raises(RemoteError) as moved:
            mp.fetch(mp.device("P1")(point_x)(p))  # a peer move P0 -> P1
        assert moved.value.rank == 0 and moved.value.remote_type == "UnsafeValueError"
        assert "helpers.Point" in str(moved.value) and "to rank 1" in str(moved.value)
        assert "trusted: true" in str(moved.value)
        with pytest.raises(UnsafeValueError, match=r"helpers\.Point.*to the driver"):
            mp.fetch(p)
        assert mp.fetch(mp.device("P0")(point_x)(p)) == 7  # it stays usable where it lives
        assert ctx.status()["protocol_errors"] == 0  # refused before sending: nothing bad sent
    trusted = _context(kind, tmp_path, True)
    with contextlib.closing(trusted), trusted:
        p = mp.device("P0")(make_point)(7)
        assert mp.fetch(mp.device("P1")(point_x)(p)) == 7
        got = mp.fetch(p)
        assert type(got).__name__ == "Point" and got.x == 7


def test_values_round_trip_exactly_between_parties_and_to_the_driver() -> None:
    raw = np.arange(256, dtype=np.uint8).tobytes()
    dtypes = ["?", "i1", "u2", "i4", "u8", "f2", "f4", "f8", "g", "c8", "c16", "U3", "S3", "V2"]
    dtypes += ["M8[ms]", "m8[s]"]
    value: dict[Any, Any] = {
        dt: np.frombuffer(raw[: 4 * np.dtype(dt).itemsize], dtype=dt).reshape(2, 2) for dt in dtypes
    }
    value["big"] = np.arange(1 << 17, dtype=np.float64)  # a 1 MiB frame
    value["nested"] = {"l": [1, (2, [3, {"d": None}])], 2**100: -(2**90), (1, 2): {1 + 2j, "s"}}
    try:
        import pandas as pd
        import pyarrow  # noqa: F401
    except ImportError:
        pd = None
    if pd is not None:
        value["df"] = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}, index=[5, 6])
    sim = mp.Simulator.simple(2, enable_spu=False, trusted=False)
    with contextlib.closing(sim), sim:
        at_p0 = mp.put("P0", value)
        at_p1 = mp.put("P1", at_p0)  # a peer move
        for got in (mp.fetch(at_p1), mp.fetch(at_p0)):
            assert got.keys() == value.keys()
            for k, v in value.items():
                if isinstance(v, np.ndarray):
                    assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes(), k
            assert got["nested"] == value["nested"]
            if pd is not None:
                pd.testing.assert_frame_equal(got["df"], value["df"])
    if pd is None:
        pytest.skip("DataFrames need pandas and pyarrow (pip install mpl[tables])")


def test_a_persisted_pickle_is_refused_naming_the_file(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    disk = SymbolDisk(tmp_path)
    info = SymbolInfo("old", "P0", (0,), True, {})
    # the layout an older mpl wrote: frames of a Lit whose value is a pickle
    frames = encode(Lit(_Marker(marker)))
    blob = [MAGIC_FRAME]
    for f in frames:
        data = bytes(f)
        blob += [len(data).to_bytes(8, "little"), data]
    (disk.dir / "old.value").write_bytes(b"".join(blob))
    (disk.dir / "old.info").write_bytes(dumps(info))
    fresh = SymbolDisk(tmp_path)
    assert [i.name for i in fresh.infos()] == ["old"]  # the older layout is still listed
    with pytest.raises(ProtocolError, match=r"old\.value.*never loaded"):
        fresh.load("old")
    assert not marker.exists()
    with pytest.raises(UnsafeValueError, match=r"helpers\.Point.*to disk"):
        fresh.save(SymbolInfo("p", "P0", (0,), True, {}), Point(1))


@pytest.fixture
def spied_sim() -> Iterator[tuple[mp.Context, dict[int, list[Record]]]]:
    """A simulator whose workers record every message they receive from the broker. Its
    waits have room (its workers' join, each call: 10 s and 30 s by default): the first SPU
    job of a process imports and compiles, tens of seconds on a loaded machine."""
    sim: Simulator = mp.Simulator.simple(3, ready_timeout=60.0, timeout=120.0)
    got: dict[int, list[Record]] = {w.rank: [] for w in sim.runtime.workers}
    for w in sim.runtime.workers:
        original = w._on_broker

        def spy(msg: Record, rank: int = w.rank, original: Any = original) -> None:
            got[rank].append(msg)
            original(msg)

        w._on_broker = spy  # type: ignore[method-assign]
    with sim:
        yield sim, got
    sim.close()


def _blob(msg: Record) -> bytes:
    return b"".join(bytes(f) for f in encode(msg))


@pytest.mark.spu
def test_traced_put_binds_each_share_and_private_value_on_its_rank_only(
    spied_sim: tuple[mp.Context, dict[int, list[Record]]],
) -> None:
    _, got = spied_sim
    secret = np.array([31415.92653589793, 27182.818284590452])
    private = np.array([123456789.123456789, 987654321.987654321])

    @mp.function
    def program() -> Any:
        s = mp.put("SP0", secret)  # shares made here, one per member
        p = mp.device("P0")(add)(private, 1.0)  # P0's private host value
        q = mp.device("P2")(double)(p)  # rank 2 takes part (and gets the program)
        return s, q

    s, q = program()
    assert np.allclose(mp.fetch(s), secret, atol=1e-3)
    assert np.allclose(mp.fetch(q), (private + 1) * 2)
    programs = {r: [m for m in msgs if isinstance(m, Program)] for r, msgs in got.items()}
    execs = {r: [m for m in msgs if isinstance(m, Exec)] for r, msgs in got.items()}
    assert all(len(programs[r]) == 1 and len(execs[r]) == 1 for r in range(3))
    shares: dict[int, list[SpuShare]] = {}
    for r in range(3):
        exec_ = execs[r][0]
        assert set(exec_.bindings) == {r}  # the broker forwards only this rank's bindings
        bound = [b.value for b in exec_.bindings[r] if isinstance(b, Lit)]
        shares[r] = [x for v in bound for x in flatten(v)[0] if isinstance(x, SpuShare)]
        assert len(shares[r]) == 1  # its own share of the secret, and nobody else's
        graph = programs[r][0].graph
        assert graph is not None
        assert not [op for op in graph.ops if op.opcode == "constant"]
        assert secret.tobytes() not in _blob(programs[r][0])
    for r in range(3):
        received = b"".join(_blob(m) for m in got[r])
        assert (private.tobytes() in received) == (r == 0)  # P0's value reached P0 alone
        for other in range(3):
            for chunk in shares[other][0].chunks:
                assert (chunk in received) == (other == r), (r, other)


def test_trusted_in_the_cluster_spec() -> None:
    spec = mp.ClusterSpec.from_dict({**mp.ClusterSpec.simple(2).to_dict(), "trusted": True})
    assert spec.trusted and mp.ClusterSpec.from_dict(spec.to_dict()) == spec
    assert (
        not mp.ClusterSpec.simple(2).trusted and "trusted" not in mp.ClusterSpec.simple(2).to_dict()
    )
    with pytest.raises(mp.ClusterSpecError, match="trusted: expected true or false"):
        mp.ClusterSpec.from_dict({**spec.to_dict(), "trusted": "yes"})


def test_a_driver_refuses_a_pickled_answer_at_once(make_cluster: Any) -> None:
    # workers that send pickles (they trust everyone), a driver that does not trust them
    spec = mp.ClusterSpec.simple(2, enable_spu=False, trusted=True)
    client = make_cluster("inproc", spec=spec).client(timeout=20)
    sid = client.open_session().session
    b = GraphBuilder(2)
    p = b.op("pcall", [], ranks=(0,), fn=b.fn(make_point), args=(3,))[0]
    job = client.submit(sid, b.build([p]), {}).job
    with pytest.raises(ProtocolError, match="pickled value"):
        client.fetch(sid, 0, f"{job}/0")  # fails on the answer, not after the 20 s deadline
