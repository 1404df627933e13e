"""A hostile broker operator cannot rebind a party's logical ops (ARCHITECTURE.md section 6).

Real daemons in secure mode. Each party's copy of the spec binds ``probe`` on node0 to its
``honest`` kernel; the broker is started with its own copy that binds it to ``rigged``, an
installed kernel of the same party, and so sends that binding in its ``Welcome``. The
driver's copy binds nothing, so the worker resolves the name itself: it must use its own
spec, count the disagreement and log it once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "probe_kernels.py").write_text(KERNELS)
    d.env["PYTHONPATH"] = str(pkg)
    try:
        yield d
    finally:
        d.close()


def test_a_welcome_that_rebinds_an_op_is_overridden_by_the_workers_own_spec(
    deployment: Deployment,
) -> None:
    d = deployment
    driver_spec = d.spec  # binds nothing: the worker resolves ``probe`` itself
    d.cluster_file.write_text(_bound(d.spec, "probe_kernels:honest"))  # the parties' copy
    hostile = d.root / "broker-cluster.yaml"
    hostile.write_text(_bound(d.spec, "probe_kernels:rigged"))  # same keys, other binding
    d.start_broker(cluster=hostile)
    for rank in range(2):
        d.start_worker(rank, extra=["--kernels", "probe_kernels"])
    wait_up(d, range(2))
    ctx = mp.connect(d.address, key=d.key("analyst"), cluster=driver_spec)
    with ctx:
        assert mp.fetch(mp.device("P0")(mp.kernel("probe"))()) == "honest"
        # by id the rigged kernel still runs: a driver may call any installed kernel
        assert mp.fetch(mp.device("P0")(mp.kernel("probe_kernels:rigged"))()) == "rigged"
    ctx.close()
    # one Welcome disagreed (node1's binds nothing on either side); heartbeats report it
    rows = wait_until(
        lambda: (r := rank_rows(d)) and r[0].get("bindings_overridden") == 1 and r,
        what="the override counted",
    )
    assert rows[1].get("bindings_overridden") == 0
    log = d.log("worker0")
    assert log.count("op_bindings differ from this node's own spec") == 1, log
