"""Per-session clusters (issue 11, part 1): a session's own devices over named nodes of the
broker's cluster, checked by name (and key), with their own SPU settings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import run_side_by_side

import mpl.driver as mp
from mpl.wire import ClusterSpec
from mpl.wire.errors import ClusterSpecError
from mpl.wire.session_cluster import session_cluster

mp.pickle_by_value(sys.modules[__name__])


def _spec(nodes: list[str], devices: dict[str, Any]) -> ClusterSpec:
    return ClusterSpec.from_dict({"nodes": [{"name": n} for n in nodes], "devices": devices})


def _semi2k_over_0_and_2() -> ClusterSpec:
    return _spec(
        ["node2", "node0"],  # any order: each node keeps the broker's rank
        {
            "alice": {"kind": "PPU", "members": ["node0"]},
            "carol": {"kind": "PPU", "members": ["node2"]},
            "S2": {
                "kind": "SPU",
                "members": ["node0", "node2"],
                "config": {"protocol": "SEMI2K", "field": "FM64"},
            },
        },
    )


def _aby3_over_all() -> ClusterSpec:
    return _spec(
        ["node0", "node1", "node2"],
        {
            **{f"P{i}": {"kind": "PPU", "members": [f"node{i}"]} for i in range(3)},
            "S3": {
                "kind": "SPU",
                "members": ["node0", "node1", "node2"],
                "config": {"protocol": "ABY3", "field": "FM64", "fxp_fraction_bits": 16},
            },
        },
    )


def test_a_session_spec_keeps_the_brokers_ranks_and_takes_its_own_devices() -> None:
    broker = ClusterSpec.simple(3)
    spec = session_cluster(broker, _semi2k_over_0_and_2())
    assert [n.name for n in spec.nodes] == ["node0", "node1", "node2"]
    assert spec.ranks("S2") == (0, 2) and spec.ranks("carol") == (2,)
    assert spec.spu_config("S2").protocol == "SEMI2K" and "SP0" not in spec.devices
    with pytest.raises(ClusterSpecError, match="'node9' is not a node of the broker's cluster"):
        session_cluster(broker, _spec(["node9"], {"X": {"kind": "PPU", "members": ["node9"]}}))
    with pytest.raises(ClusterSpecError, match="nodes: 4 given"):
        session_cluster(ClusterSpec.simple(3), ClusterSpec.simple(4).to_dict())


def test_a_spec_that_disagrees_with_the_brokers_keys_is_refused() -> None:
    def keys(n: int) -> list[str]:
        return [zmq.curve_keypair()[0].decode() for _ in range(n)]

    broker_key, node_keys, driver_key = keys(1)[0], keys(3), keys(1)[0]
    broker = ClusterSpec.simple(3).with_keys(broker_key, node_keys, {"me": driver_key})
    same = session_cluster(broker, broker.to_dict())
    assert [n.curve_key for n in same.nodes] == node_keys
    forged = broker.with_keys(
        broker_key, [node_keys[0], keys(1)[0], node_keys[2]], {"me": driver_key}
    )
    with pytest.raises(ClusterSpecError, match=r"nodes\.node1\.curve_key: disagrees"):
        session_cluster(broker, forged)
    other_broker = broker.with_keys(keys(1)[0], node_keys, {"me": driver_key})
    with pytest.raises(ClusterSpecError, match=r"broker\.curve_key"):
        session_cluster(broker, other_broker)


@pytest.mark.spu
def test_two_sessions_with_different_spu_protocols_run_concurrently() -> None:
    sim = mp.Simulator.simple(3)  # the broker's spec: SP0 = SEMI2K/FM128 over all three
    semi = mp.connect(sim.address, cluster=_semi2k_over_0_and_2())
    aby3 = mp.connect(sim.address, cluster=_aby3_over_all())
    results: dict[str, Any] = {}

    def millionaire() -> None:
        with semi:
            for _ in range(3):
                a = mp.put("alice", np.array([3.0, 9.0]))
                c = mp.put("carol", np.array([5.0, 5.0]))
                z = mp.device("S2")(lambda x, y: x < y)(a, c)
                results["semi"] = (z.parties, mp.fetch(z))

    def matmul() -> None:
        with aby3:
            for _ in range(3):
                a = mp.put("P0", np.arange(4.0).reshape(2, 2))
                b = mp.put("P1", np.eye(2) * 2)
                z = mp.device("S3")(lambda x, y: x @ y + 0.25)(a, b)
                results["aby3"] = (z.parties, mp.fetch(z))

    try:
        with pytest.raises(mp.DeviceNotFoundError), semi:
            mp.device("SP0")(lambda: 1)()  # the broker's device is not this session's
        errors = run_side_by_side(millionaire, matmul)
        assert not errors, errors
        parties, lt = results["semi"]
        assert parties == (0, 2) and lt.tolist() == [True, False]
        parties, product = results["aby3"]
        assert parties == (0, 1, 2)
        assert np.allclose(product, np.arange(4.0).reshape(2, 2) * 2 + 0.25, atol=1e-3)
        unknown = _spec(["node0", "nodeX"], {"Q": {"kind": "PPU", "members": ["nodeX"]}})
        with pytest.raises(ClusterSpecError, match="'nodeX' is not a node"):
            mp.connect(sim.address, cluster=unknown)
    finally:
        for ctx in (semi, aby3, sim):
            ctx.close()


def test_a_sessions_own_op_bindings_choose_the_kernel(tmp_path: Path) -> None:
    (tmp_path / "rank0").mkdir()
    np.save(tmp_path / "rank0" / "x.npy", np.arange(3.0))  # rank 0's data root
    sim = mp.Simulator.simple(2, data_root=tmp_path)  # the broker's spec binds nothing
    spec = ClusterSpec.simple(2, op_bindings=[{"table.load": "mpl.io.read_npy"}, {}])
    ctx = mp.connect(sim.address, cluster=spec)
    try:
        with ctx:
            loaded = mp.device("P0")(mp.kernel("table.load"))("x.npy")
            assert mp.fetch(loaded).tolist() == [0.0, 1.0, 2.0]
        with sim, pytest.raises(mp.RemoteError, match=r"'table\.load' is not bound"):
            mp.fetch(mp.device("P0")(mp.kernel("table.load"))("x.npy"))
    finally:
        ctx.close()
        sim.close()


@pytest.mark.daemons
@pytest.mark.spu
def test_secure_sessions_take_their_devices_from_the_drivers_own_copy(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", world_size=3, secure=True, spec=ClusterSpec.simple(3))
    pinned = cluster.impl.cluster  # the spec with every key, as the parties agreed on it
    key = cluster.impl.key_file("local")
    mine = pinned.to_dict()
    mine["devices"] = _semi2k_over_0_and_2().to_dict()["devices"]  # same nodes, own devices
    with mp.connect(cluster.address, key=key, cluster=ClusterSpec.from_dict(mine)) as ctx:
        a, c = mp.put("alice", np.array([1.0, 7.0])), mp.put("carol", np.array([2.0, 2.0]))
        assert mp.fetch(mp.device("S2")(lambda x, y: x < y)(a, c)).tolist() == [True, False]
        ctx.close()
    forged = dict(mine, nodes=[dict(n) for n in mine["nodes"]])
    forged["nodes"][1]["curve_key"] = zmq.curve_keypair()[0].decode()
    with pytest.raises(ClusterSpecError, match=r"nodes\.node1\.curve_key: disagrees"):
        mp.connect(cluster.address, key=key, cluster=ClusterSpec.from_dict(forged))
