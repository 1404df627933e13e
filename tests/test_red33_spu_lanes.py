"""Red team w33 (R33-4, closed): a driver's SPU ops named any device, and each name was a lane.

An SPU member keeps one libspu link and Runtime per ``(session, device, members, the
members' incarnations)`` (``worker/spu_kernels.SpuService._lane``) until the session ends or
one of its SPU jobs fails. ``device`` is the string the driver's program writes in the op's
attributes, checked only for being a string: no worker compares it with the devices of the
spec. So a driver that names a new device in each job makes every member build and keep a
new lane per job, for the session's life: about 45 KB per lane on each member with SEMI2K
(400 jobs: +17 MB per worker), more with a protocol whose set-up is heavier (the op's
``config`` is the driver's too), and ``drop_lanes`` scans them all at each failed SPU job
or session end.

Who can: only a driver a member lets ship code (``spu.run`` carries a pickled JAX function,
refused from a ``code: kernels`` driver), which README says is trusted with that whole
worker anyway; so this is a table keyed by a driver's word without a bound (ARCHITECTURE
section 6: every table keyed by network input is bounded), hit by a buggy driver as easily
as by a hostile one, not a way past a trust boundary.

What a fix needs: an SPU op's ``device`` must be a device of the session's cluster spec
with exactly the members the op names (refused with ``GraphError`` or a ``ProtocolError``
naming the device otherwise), so a session holds at most one lane per spec device (per
restart of a member); or, failing that, a bound on lanes per session that every member
applies at the same point. Not made here: the device table a worker should check against
is the session's own spec (sessions may carry one), which reaches ``SpuService`` nowhere
today.

Closed: the broker's ``SessionRuntime`` brings each session's SPU devices (name -> members'
ranks) to the workers of a session with its own spec; other sessions run on the cluster's
devices. An SPU member refuses (``GraphError`` naming the device) to make a lane for a
device not among them, or with other members, so a session holds at most one lane per spec
device (per restart of a member). The check runs once per lane made, not per job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import one

import mpl.driver as mp
from mpl.wire import ClusterSpec
from mpl.wire.errors import GraphError, MplError
from mpl.wire.graph import Graph, Op
from mpl.wire.session_cluster import spu_devices
from mpl.wire.sessions import SessionRuntime
from mpl.worker.session_runtime import MAX_SPU_TABLE_ENTRIES, SessionRuntimes
from mpl.worker.spu_kernels import _check_device

pytestmark = pytest.mark.daemons

JOBS = 24
LANES_PER_SESSION = 4  # the spec has one SPU device: a session needs one lane per member


@mp.function
def _compare() -> Any:
    a = mp.device("P0")(one)()
    b = mp.device("P1")(one)()
    return mp.device("SP0")(lambda x, y: x < y)(a, b)


def _renamed(graph: Graph, device: str) -> Graph:
    """``graph`` with every SPU op naming ``device``: what a driver's own tracer may write."""
    ops = tuple(
        Op(op.opcode, op.inputs, op.nout, op.ranks, {**op.attrs, "device": device})
        if "device" in op.attrs
        else op
        for op in graph.ops
    )
    return Graph(graph.world_size, graph.inputs, ops, graph.outputs, graph.fns, graph.name)


def test_a_session_cannot_make_a_lane_per_device_name(make_cluster: Callable[..., Any]) -> None:
    cluster = make_cluster("tcp", spec=ClusterSpec.simple(2))
    ctx = mp.connect(cluster.address)
    try:
        with ctx:
            assert mp.fetch(mp.put("P0", _compare())) is not None  # SP0 works: one lane
            graph = _compare.compile(ctx.cluster).graph
            refused = 0
            for n in range(JOBS):
                try:
                    ctx.run(_renamed(graph, f"not-a-device-{n}"), {})
                except MplError as exc:  # a fixed worker refuses the made-up name
                    refused += "not an SPU device of this session" in str(exc)
            # the lane counts reach the status with the workers' heartbeats: a loaded machine
            # shows them late, so watch for a while before taking "bounded" for an answer
            deadline = time.monotonic() + 15.0
            while True:
                lanes = [row.get("spu_lanes", 0) for row in ctx.status()["ranks"]]
                if max(lanes) > LANES_PER_SESSION or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert max(lanes) <= LANES_PER_SESSION, lanes
            assert refused == JOBS  # each one refused for its device, not another reason
    finally:
        ctx.close()


def test_a_member_takes_only_a_spec_device_with_its_members() -> None:
    spec = ClusterSpec.simple(3, spu_members=[2, 0])
    devices = {name: tuple(m) for name, m in spu_devices(spec.to_dict()).items()}
    assert devices == {"SP0": (2, 0)}
    _check_device(devices, "SP0", (2, 0))  # the driver's own ops: as the spec says
    with pytest.raises(GraphError, match="'SP9' is not an SPU device"):
        _check_device(devices, "SP9", (2, 0))
    with pytest.raises(GraphError, match="members"):
        _check_device(devices, "SP0", (0, 2))  # other order: another member's local rank
    with pytest.raises(GraphError, match="not an SPU device"):
        _check_device(devices, "P0", (0,))  # a PPU is no SPU
    with pytest.raises(GraphError) as info:
        _check_device(devices, "x" * 10_000, (2, 0))
    assert len(str(info.value)) < 300  # the driver's name is cut, not echoed whole


def test_a_session_with_its_own_spec_runs_on_its_own_devices() -> None:
    node = SessionRuntimes(0, dict, cluster=ClusterSpec.simple(2).to_dict)
    assert dict(node.spu_devices("plain")) == {"SP0": (0, 1)}  # no own spec: the cluster's
    node.open(SessionRuntime("own", 1, {}, {"S": [1, 0], "T": [0, 1]}))
    assert dict(node.spu_devices("own")) == {"S": (1, 0), "T": (0, 1)}
    node.closed("own")
    assert dict(node.spu_devices("own")) == {"SP0": (0, 1)}


def test_a_brokers_device_table_is_bounded() -> None:
    """The table comes from the broker (a session's own spec): one past the bounds refuses
    the session as an oversized runtime_info does, and a refused one keeps nothing."""
    node = SessionRuntimes(0, dict)
    big = {f"D{n}": [0, 1] for n in range(MAX_SPU_TABLE_ENTRIES // 3 + 1)}
    answer = node.open(SessionRuntime("big", 1, {}, big))
    assert answer is not None and answer.error is not None
    assert "spu_devices" in answer.error.message
    long_name = node.open(SessionRuntime("long", 2, {}, {"x" * 65: [0, 1]}))
    assert long_name is not None and long_name.error is not None
    assert node.spu_entries == 0
    node.open(SessionRuntime("ok", 3, {}, {"S": [0, 1]}))
    assert node.spu_entries == 3
    node.open(SessionRuntime("ok", 0, {}, {"S": [0, 1], "T": [1, 0]}))  # announced again
    assert node.spu_entries == 6
    node.close_all()
    assert node.spu_entries == 0
