"""A hostile broker operator cannot rebind a party's logical ops (ARCHITECTURE.md section 6).

Real daemons in secure mode. Each party's copy of the spec binds ``probe`` on node0 to its
``honest`` kernel; the broker is started with its own copy that binds it to ``rigged``, an
installed kernel of the same party, and so sends that binding in its ``Welcome``. The
driver's copy binds nothing, so the worker resolves the name itself: it must use its own
spec, count the disagreement and log it once.
"""

from __future__ import annotations

from typing import Any

import pytest
from deployment import Deployment
from helpers import wait_until
from test_secure import rank_rows, wait_up

import mpl.driver as mp
from mpl.wire import ClusterSpec

pytestmark = pytest.mark.daemons

KERNELS = """
def honest():
    return "honest"


def rigged():
    return "rigged"
"""


def _bound(spec: ClusterSpec, kernel_id: str) -> str:
    data = spec.to_dict()
    data["nodes"][0]["runtime_info"]["op_bindings"] = {"probe": kernel_id}
    return ClusterSpec.from_dict(data).to_yaml()


@pytest.fixture
def deployment(deployment: Deployment) -> Deployment:
    """conftest's deployment, with the kernels module its workers import."""
    deployment.add_module("probe_kernels", KERNELS)
    return deployment


def test_a_welcome_that_rebinds_an_op_is_overridden_by_the_workers_own_spec(
    deployment: Deployment,
) -> None:
    d = deployment
    driver_spec = d.spec  # binds nothing: the worker resolves ``probe`` itself
    d.cluster_file.write_text(_bound(d.spec, "probe_kernels:honest"))  # the parties' copy
    hostile = d.root / "broker-cluster.yaml"
    hostile.write_text(_bound(d.spec, "probe_kernels:rigged"))  # same keys, other binding
    d.start_broker(cluster=hostile)
    for rank in range(2):  # -v: each Welcome taken is logged ("joined broker")
        d.start_worker(rank, extra=["--kernels", "probe_kernels", "-v"])
    wait_up(d, range(2))
    ctx = mp.connect(d.address, key=d.key("analyst"), cluster=driver_spec)
    with ctx:
        assert mp.fetch(mp.device("P0")(mp.kernel("probe"))()) == "honest"
        # by id the rigged kernel still runs: a driver may call any installed kernel
        assert mp.fetch(mp.device("P0")(mp.kernel("probe_kernels:rigged"))()) == "rigged"
    ctx.close()

    # every Welcome rank 0 took disagreed (node1's binds nothing on either side), and
    # heartbeats report the count. Usually one; on a loaded machine a Hello retried before
    # its Welcome came back gets a second Welcome, so count the joins the worker logged.
    def counted() -> dict[int, dict[str, Any]] | None:
        rows = rank_rows(d)
        n = rows[0].get("bindings_overridden", 0)
        return rows if n >= 1 and n == d.log("worker0").count("joined broker") else None

    try:
        rows = wait_until(counted, timeout=20, what="the override counted once per Welcome")
    except AssertionError as exc:  # say what was seen: this failed under load before
        raise AssertionError(f"{exc}: rows {rank_rows(d)}, log {d.log('worker0')}") from exc
    assert rows[1].get("bindings_overridden") == 0
    log = d.log("worker0")
    assert log.count("op_bindings differ from this node's own spec") == 1, log
