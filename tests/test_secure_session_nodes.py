"""Secure sessions over any nodes in any order (issue 11, gap 2): a driver's own copy of the
spec may name a subset of the broker's nodes, listed in any order; jobs are sealed for each
node by name, at the rank the broker gave it, and keys that disagree are refused."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import run_side_by_side

import mpl.driver as mp
from mpl.wire import ClusterSpec
from mpl.wire.errors import ClusterSpecError

mp.pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.daemons, pytest.mark.spu]


def _own_copy(pinned: ClusterSpec, names: list[str], devices: dict[str, Any]) -> ClusterSpec:
    """The driver's copy: the agreed keys of the nodes ``names``, in that order."""
    data = pinned.to_dict()
    by_name = {n["name"]: n for n in data["nodes"]}
    data["nodes"] = [by_name[n] for n in names]
    data["devices"] = devices
    return ClusterSpec.from_dict(data)


_SEMI2K_OVER_2_AND_0 = {
    "carol": {"kind": "PPU", "members": ["node2"]},
    "alice": {"kind": "PPU", "members": ["node0"]},
    "S2": {
        "kind": "SPU",
        "members": ["node2", "node0"],
        "config": {"protocol": "SEMI2K", "field": "FM64"},
    },
}
_ABY3_OVER_ALL = {
    **{f"P{i}": {"kind": "PPU", "members": [f"node{i}"]} for i in range(3)},
    "S3": {
        "kind": "SPU",
        "members": ["node0", "node1", "node2"],
        "config": {"protocol": "ABY3", "field": "FM64", "fxp_fraction_bits": 16},
    },
}


def test_a_secure_session_over_two_nodes_reversed_runs_beside_one_over_all(
    make_cluster: Any,
) -> None:
    cluster = make_cluster("tcp", world_size=3, secure=True, spec=ClusterSpec.simple(3))
    pinned = cluster.impl.cluster  # every key, as the parties agreed on them
    key = cluster.impl.key_file("local")
    pair = mp.connect(
        cluster.address,
        key=key,
        cluster=_own_copy(pinned, ["node2", "node0"], _SEMI2K_OVER_2_AND_0),
    )
    everyone = mp.connect(
        cluster.address,
        key=key,
        cluster=_own_copy(pinned, ["node1", "node2", "node0"], _ABY3_OVER_ALL),
    )
    results: dict[str, Any] = {}

    def on_the_pair() -> None:
        with pair:
            c = mp.device("carol")(lambda: np.array([5.0, 5.0, 1.0]))()  # a pcall on node2
            a = mp.put("alice", np.array([3.0, 9.0, 0.5]))
            moved = mp.device("carol")(lambda x: x * 2)(a)  # a move from node0 to node2
            results["pcall"] = (c.parties, mp.fetch(c).tolist())
            results["move"] = (moved.parties, mp.fetch(moved).tolist())
            lt = mp.device("S2")(lambda x, y: x < y)(a, c)
            results["spu"] = (lt.parties, mp.fetch(lt).tolist())

    def on_all_three() -> None:
        with everyone:
            a = mp.put("P0", np.arange(4.0).reshape(2, 2))
            b = mp.put("P2", np.eye(2) * 2)
            z = mp.device("S3")(lambda x, y: x @ y + 0.25)(a, b)
            results["aby3"] = (z.parties, mp.fetch(z))

    try:
        errors = run_side_by_side(on_the_pair, on_all_three)
        assert not errors, errors
        assert results["pcall"] == ((2,), [5.0, 5.0, 1.0])
        assert results["move"] == ((2,), [6.0, 18.0, 1.0])
        assert results["spu"] == ((0, 2), [True, False, True])  # held by both members
        parties, product = results["aby3"]
        assert parties == (0, 1, 2)
        assert np.allclose(product, np.arange(4.0).reshape(2, 2) * 2 + 0.25, atol=1e-3)
        with pair, pytest.raises(mp.DeviceNotFoundError):
            mp.device("P1")(lambda: 1)()  # node1 is not in this driver's copy
    finally:
        pair.close()
        everyone.close()


def test_a_secure_subset_with_a_wrong_key_is_refused(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", world_size=3, secure=True, spec=ClusterSpec.simple(3))
    pinned = cluster.impl.cluster
    key = cluster.impl.key_file("local")
    forged = _own_copy(pinned, ["node2", "node0"], _SEMI2K_OVER_2_AND_0).to_dict()
    forged["nodes"][0]["curve_key"] = zmq.curve_keypair()[0].decode()
    with pytest.raises(ClusterSpecError, match=r"nodes\.node2\.curve_key: disagrees"):
        mp.connect(cluster.address, key=key, cluster=ClusterSpec.from_dict(forged))
    unknown = _own_copy(pinned, ["node2", "node0"], _SEMI2K_OVER_2_AND_0).to_dict()
    unknown["nodes"][1]["name"] = "node7"
    unknown["devices"] = {"alice": {"kind": "PPU", "members": ["node7"]}}
    with pytest.raises(ClusterSpecError, match="'node7' is not a node"):
        mp.connect(cluster.address, key=key, cluster=ClusterSpec.from_dict(unknown))
    picky = _own_copy(pinned, ["node2", "node0"], _SEMI2K_OVER_2_AND_0).to_dict()
    picky["nodes"][1]["runtime_info"] = {"version": "99.0", "platform": "N/A"}
    with pytest.raises(ClusterSpecError, match=r"rank 0: runtime_info\.version '99\.0'"):
        mp.connect(cluster.address, key=key, cluster=ClusterSpec.from_dict(picky))
    # the refusals left the cluster usable
    good = _own_copy(pinned, ["node2", "node0"], _SEMI2K_OVER_2_AND_0)
    with mp.connect(cluster.address, key=key, cluster=good) as ctx:
        assert mp.fetch(mp.device("alice")(lambda: 41 + 1)()) == 42
        ctx.close()
