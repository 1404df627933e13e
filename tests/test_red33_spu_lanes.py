"""Red team w33 (R33-4, open): a driver's SPU ops name any device, and each name is a lane.

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
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import one

import mpl.driver as mp
from mpl.wire import ClusterSpec
from mpl.wire.errors import MplError
from mpl.wire.graph import Graph, Op

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


@pytest.mark.xfail(
    strict=True,
    reason="R33-4: an SPU op's device is any string the driver writes, and each new one "
    "is a lane kept for the session's life on every member; see the docstring",
)
def test_a_session_cannot_make_a_lane_per_device_name(make_cluster: Callable[..., Any]) -> None:
    cluster = make_cluster("tcp", spec=ClusterSpec.simple(2))
    ctx = mp.connect(cluster.address)
    try:
        with ctx:
            assert mp.fetch(mp.put("P0", _compare())) is not None  # SP0 works: one lane
            graph = _compare.compile(ctx.cluster).graph
            for n in range(JOBS):
                with contextlib.suppress(MplError):  # a fixed worker refuses the made-up name
                    ctx.run(_renamed(graph, f"not-a-device-{n}"), {})
            # the lane counts reach the status with the workers' heartbeats: a loaded machine
            # shows them late, so watch for a while before taking "bounded" for an answer
            deadline = time.monotonic() + 15.0
            while True:
                lanes = [row.get("spu_lanes", 0) for row in ctx.status()["ranks"]]
                if max(lanes) > LANES_PER_SESSION or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert max(lanes) <= LANES_PER_SESSION, lanes
    finally:
        ctx.close()
