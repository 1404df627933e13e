"""mplang's spellings: ClusterSpec.simple's keywords and defaults, evaluate / fetch /
make_simulator / make_driver, and the ported mplang programs in examples/mplang/."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import mpl.driver as mp
from mpl.wire import ClusterSpec, ClusterSpecError

ROOT = Path(__file__).resolve().parent.parent


def test_simple_takes_mplangs_keywords_and_defaults() -> None:
    spec = ClusterSpec.simple(
        2,
        runtime_version="1.2",
        runtime_platform="linux",
        op_bindings=[{"io.read": "mpl.io:read_npy"}, {}],
    )
    assert spec.spu_config("SP0").field == "FM128"  # mplang's default field
    assert [n.endpoint for n in spec.nodes] == ["localhost:5000", "localhost:5001"]
    info = spec.nodes[0].runtime_info
    assert (info.version, info.platform) == ("1.2", "linux")
    assert info.op_bindings == {"io.read": "mpl.io:read_npy"}
    assert spec.nodes[1].runtime_info.op_bindings == {}
    assert sorted(spec.devices) == ["P0", "P1", "SP0", "local_0", "local_1"]
    assert spec.devices["local_1"].kind == "PPU" and spec.ranks("local_1") == (1,)
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    shared = ClusterSpec.simple(3, op_bindings={"k": "m:f"})
    assert all(n.runtime_info.op_bindings == {"k": "m:f"} for n in shared.nodes)
    assert sorted(ClusterSpec.simple(2, enable_local_device=False).devices) == ["P0", "P1", "SP0"]
    assert sorted(ClusterSpec.simple(2, enable_spu_device=False).devices) == [
        "P0",
        "P1",
        "local_0",
        "local_1",
    ]
    with pytest.raises(ClusterSpecError, match="op_bindings: 1 given for 2 nodes"):
        ClusterSpec.simple(2, op_bindings=[{}])
    with pytest.raises(ClusterSpecError, match="at least one"):
        ClusterSpec.simple(
            2, enable_ppu_device=False, enable_local_device=False, enable_spu_device=False
        )


def test_yaml_numbers_for_version_and_the_local_kind() -> None:
    spec = ClusterSpec.from_yaml(
        "nodes:\n"
        "  - {name: a, endpoint: 'h:1', runtime_info: {version: 1.0, platform: x86}}\n"
        "  - {name: b, endpoint: 'h:2', runtime_info: {version: 2}}\n"
        "devices:\n"
        "  local_0: {kind: local, members: [a]}\n"
        "  SP0: {kind: SPU, members: [a, b]}\n"
    )
    assert [n.runtime_info.version for n in spec.nodes] == ["1.0", "2"]
    assert spec.devices["local_0"].kind == "PPU"
    assert spec.spu_config("SP0").field == "FM128"
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    bad = spec.to_dict()
    bad["nodes"][0]["runtime_info"]["version"] = True
    with pytest.raises(ClusterSpecError, match=r"nodes\[0\]\.runtime_info\.version"):
        ClusterSpec.from_dict(bad)


@pytest.fixture(scope="module")
def sim() -> Iterator[mp.Context]:
    ctx = mp.make_simulator(2)
    yield ctx
    ctx.close()


def test_evaluate_and_fetch_in_both_spellings(sim: mp.Context) -> None:
    def program(n: int) -> mp.Value:
        x = mp.device("P0")(np.arange)(n)
        out: mp.Value = mp.device("local_1")(lambda v: v.sum())(x)  # a mplang v1 local device
        return out

    v1 = mp.evaluate(sim, program, 4)  # mplang v1: evaluate(ctx, fn, *args)
    assert mp.fetch(sim, v1) == 6  # fetch(ctx, value)
    v2 = mp.evaluate(program, 5, context=sim)  # mplang v2: evaluate(fn, *args, context=)
    assert mp.fetch(v2, context=sim) == 10
    offline = mp.compile(program, 3, cluster=ClusterSpec.simple(2))  # no context needed
    assert "pcall" in str(offline)
    assert mp.fetch(sim, mp.evaluate(sim, offline, 3)) == 3  # mplang: evaluate(ctx, compiled)
    traced = mp.evaluate(sim, mp.function(program), 3)
    assert mp.get_dev_attr(traced) == "local_1" and mp.is_device_obj(traced)
    secret = mp.evaluate(sim, lambda: mp.device("SP0")(lambda a: a * 3)(mp.put("P0", 7)))
    assert int(mp.fetch(sim, secret)) == 21
    assert mp.fetch(sim, 5) == 5  # plain values pass through
    mp.set_root_context(sim)
    try:
        assert mp.fetch(mp.evaluate(program, 2)) == 1  # no context named: the root one
    finally:
        mp.set_root_context(None)
    with pytest.raises(TypeError, match="expected a function"):
        mp.evaluate(sim, 3)


def test_make_driver_attaches_and_checks_the_spec(sim: mp.Context) -> None:
    renamed = ClusterSpec.from_dict(
        {
            "nodes": [{"name": "node0"}, {"name": "node1"}],
            "devices": {
                "alice": {"kind": "PPU", "members": ["node0"]},
                "bob": {"kind": "local", "members": ["node1"]},
            },
        }
    )
    ctx = mp.make_driver([sim.address], cluster_spec=renamed)
    try:
        with ctx:
            x = mp.device("alice")(lambda: 20)()
            assert mp.fetch(mp.device("bob")(lambda v: v + 1)(x)) == 21
    finally:
        ctx.close()
    swapped = renamed.to_dict()
    swapped["nodes"].reverse()  # nodes are matched by name: each keeps the broker's rank
    ctx = mp.make_driver(sim.address, cluster_spec=ClusterSpec.from_dict(swapped))
    try:
        with ctx:
            assert mp.device("alice")(lambda: 1)().parties == (0,)
    finally:
        ctx.close()
    unknown = renamed.to_dict()
    unknown["nodes"][1]["name"] = "nodeX"
    unknown["devices"]["bob"]["members"] = ["nodeX"]
    with pytest.raises(ClusterSpecError, match="'nodeX' is not a node of the broker's cluster"):
        mp.make_driver(sim.address, cluster_spec=ClusterSpec.from_dict(unknown))
    with pytest.raises(ValueError, match="one broker"):
        mp.make_driver(["h:1", "h:2"])
    with pytest.raises(ClusterSpecError, match="world_size"):
        mp.make_simulator(3, cluster_spec=ClusterSpec.simple(2))


def test_simulator_simple_takes_op_bindings() -> None:
    sim = mp.Simulator.simple(2, op_bindings=[{"a": "m:f"}, {"a": "m:g"}], spu_field="FM64")
    try:
        assert sim.cluster.nodes[1].runtime_info.op_bindings == {"a": "m:g"}
        assert sim.cluster.spu_config("SP0").field == "FM64"
    finally:
        sim.close()
    v1 = mp.Simulator(2)  # mplang v1's Simulator(world_size)
    try:
        assert v1.cluster == ClusterSpec.simple(2)
    finally:
        v1.close()


@pytest.mark.spu
@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("millionaire.py", "alice is poorer = "),
        ("device_basics.py", "42 doubled on SP0, back on P0: 84"),
    ],
)
def test_ported_mplang_programs_run(script: str, expect: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mplang" / script)],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "JAX_ENABLE_X64": "1"},
        cwd=tmp_path,  # anything a library writes to the working directory lands here
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert expect in out.stdout
