"""ClusterSpec: construction, exact round trips, and every named validation error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mpl.wire import ClusterSpec, ClusterSpecError


def base() -> dict[str, Any]:
    return {
        "cluster_id": "demo",
        "nodes": [
            {
                "name": "alice",
                "endpoint": "127.0.0.1:6000",
                "runtime_info": {
                    "version": "1",
                    "platform": "linux",
                    "op_bindings": {"a": "b"},
                    "zone": "eu",
                },
            },
            {"name": "bob", "endpoint": "127.0.0.1:6001"},
            {"name": "carol"},
        ],
        "devices": {
            "P0": {"kind": "PPU", "members": ["alice"]},
            "P1": {"kind": "ppu", "members": ["bob"]},
            "SP0": {
                "kind": "SPU",
                "members": ["alice", "bob", "carol"],
                "config": {"protocol": "ABY3", "field": "FM64", "fxp_fraction_bits": 18},
            },
        },
    }


def test_simple_cluster() -> None:
    spec = ClusterSpec.simple(3)
    assert spec.world_size == 3
    assert [n.name for n in spec.nodes] == ["node0", "node1", "node2"]
    assert sorted(spec.devices) == ["P0", "P1", "P2", "SP0", "local_0", "local_1", "local_2"]
    assert spec.ranks("SP0") == (0, 1, 2) and spec.ranks("P2") == (2,)
    cfg = spec.spu_config("SP0")
    assert (cfg.protocol, cfg.field, cfg.fxp_fraction_bits) == ("SEMI2K", "FM128", 18)
    assert "SP0" not in ClusterSpec.simple(1).devices
    assert ClusterSpec.simple(3, spu_members=[1, 2]).ranks("SP0") == (1, 2)
    assert ClusterSpec.simple(2).ppu_of(1) == "P1"


def test_round_trips_exactly() -> None:
    spec = ClusterSpec.from_dict(base())
    again = ClusterSpec.from_dict(spec.to_dict())
    assert again == spec
    assert again.to_dict() == spec.to_dict()
    assert spec.nodes[0].runtime_info.extra == {"zone": "eu"}
    assert spec.to_dict()["nodes"][0]["runtime_info"]["zone"] == "eu"
    assert spec.devices["P1"].kind == "PPU"
    assert ClusterSpec.from_yaml(spec.to_yaml()) == spec


def test_from_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(ClusterSpec.simple(2).to_yaml())
    assert ClusterSpec.from_yaml(path) == ClusterSpec.simple(2)
    assert ClusterSpec.from_yaml(str(path)) == ClusterSpec.simple(2)
    with pytest.raises(ClusterSpecError, match="does not parse"):
        ClusterSpec.from_yaml("nodes: [unclosed")


def broken(edit: Any) -> dict[str, Any]:
    d = copy.deepcopy(base())
    edit(d)
    return d


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("nodes"), r"cluster\.nodes: missing key"),
        (lambda d: d.pop("devices"), r"cluster\.devices: missing key"),
        (lambda d: d["nodes"].append({"name": "bob"}), r"nodes\[3\]\.name: duplicate node 'bob'"),
        (lambda d: d["nodes"][1].pop("name"), r"nodes\[1\]\.name: missing key"),
        (lambda d: d["devices"]["P0"].pop("kind"), r"devices\.P0\.kind: missing key"),
        (lambda d: d["devices"]["P0"].pop("members"), r"devices\.P0\.members: missing key"),
        (lambda d: d["devices"]["P0"].update(kind="TPU"), r"devices\.P0\.kind: unknown kind"),
        (
            lambda d: d["devices"]["P0"].update(members=["mallory"]),
            r"devices\.P0\.members: unknown member 'mallory'",
        ),
        (
            lambda d: d["devices"]["P0"].update(members=["alice", "bob"]),
            r"devices\.P0\.members: a PPU has exactly one member, got 2",
        ),
        (
            lambda d: d["devices"]["SP0"]["config"].update(protocol="GMW"),
            r"devices\.SP0\.config\.protocol: unknown SPU protocol 'GMW'",
        ),
        (
            lambda d: d["devices"]["SP0"]["config"].update(field="FM7"),
            r"devices\.SP0\.config\.field: unknown SPU field 'FM7'",
        ),
        (
            lambda d: d["devices"]["SP0"].update(members=["alice"]),
            r"devices\.SP0\.members: an SPU needs a world size of at least 2",
        ),
        (
            lambda d: d["devices"]["SP0"].update(members=["alice", "bob"]),
            r"ABY3 runs with exactly 3 members, got 2",
        ),
        (
            lambda d: d["devices"]["SP0"]["config"].update(fxp_fraction_bits=-1),
            r"fxp_fraction_bits: expected a positive int",
        ),
        (
            lambda d: d["devices"]["SP0"]["config"].update(recv_timeout_ms="x"),
            r"recv_timeout_ms: expected a positive int",
        ),
        (lambda d: d.update(nodes=[]), r"nodes: expected a non-empty list"),
    ],
)
def test_validation_errors_name_the_field(edit: Any, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        ClusterSpec.from_dict(broken(edit))


def test_cluster_spec_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="CHEETAH runs with exactly 2 members"):
        ClusterSpec.simple(3, spu_protocol="CHEETAH")
    with pytest.raises(ClusterSpecError, match="world_size"):
        ClusterSpec.simple(0)
