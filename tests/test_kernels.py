"""Named kernels (``mp.kernel``) and ``mpl-worker --code kernels``, with real daemons.

One cluster of two workers over a small package on their PYTHONPATH: a module loaded with
``--kernels``, and an installed distribution (``*.dist-info``) declaring an ``mpl.kernels``
entry point. The nodes bind the same kernels under different logical names through their
``op_bindings``; rank 0 refuses shipped code (``--code kernels``), rank 1 takes any.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpl.driver as mp
from mpl.driver.context import Context
from mpl.driver.launcher import ProcessCluster
from mpl.wire import ClusterSpec

pytestmark = pytest.mark.daemons

KERNEL_MODULE = """
import numpy as np


def scale(x, factor=2):
    return np.asarray(x) * factor


def summary(x):
    x = np.asarray(x)
    return float(x.sum()), int(x.size)


class Box:  # not in the safe value format: it crosses only a trusted cluster, pickled
    def __init__(self, x):
        self.x = x


def boxed(x):
    return Box(x)
"""


class Trap:
    """A "function" whose unpickling creates ``path``: proof of whether it was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))  # unpickling = open(path, "w") = a new file

    def __call__(self, *args: Any) -> Any:
        return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    pkg = tmp_path_factory.mktemp("pkg")
    (pkg / "acme_kernels.py").write_text(KERNEL_MODULE)
    dist = pkg / "acme_kernels-0.1.dist-info"  # what installing a package leaves behind
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-kernels\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mpl.kernels]\nacme.summary = acme_kernels:summary\n")
    spec = ClusterSpec.simple(
        2,
        trusted=True,  # so a pickled peer move can reach the rank that refuses code
        op_bindings=[
            {"math.scale": "acme_kernels:scale", "stats.summary": "acme.summary"},
            {"times": "acme_kernels:scale", "summarize": "acme.summary"},
        ],
    )
    procs = ProcessCluster(
        spec,
        run_dir=tmp_path_factory.mktemp("run"),
        env={"PYTHONPATH": str(pkg)},
        worker_args={
            0: ["--kernels", "acme_kernels", "--code", "kernels"],
            1: ["--kernels", "acme_kernels"],
        },
    )
    yield procs
    procs.close()


@pytest.fixture
def ctx(cluster: ProcessCluster) -> Iterator[Context]:
    context = mp.connect(cluster.address)
    with context:
        yield context
    context.close()


def test_one_kernel_under_different_names_on_two_nodes(ctx: Context) -> None:
    x = mp.put("P0", np.arange(3.0))
    np.testing.assert_array_equal(mp.fetch(mp.device("P0")(mp.kernel("math.scale"))(x)), [0, 2, 4])
    tripled = mp.device("P1")(mp.kernel("times"))(x, factor=3)  # moved P0 -> P1 first
    np.testing.assert_array_equal(mp.fetch(tripled), [0, 3, 6])
    total, count = mp.device("P1", nout=2)(mp.kernel("summarize"))(x)  # an entry point
    assert (mp.fetch(total), mp.fetch(count)) == (3.0, 3)
    total, count = mp.device("P0", nout=2)(mp.kernel("stats.summary"))(x)  # the same, on P0
    assert (mp.fetch(total), mp.fetch(count)) == (3.0, 3)

    @mp.function
    def traced(v: mp.Value) -> Any:
        doubled = mp.device("P0")(mp.kernel("math.scale"))(v)
        return mp.device("P1", nout=2)(mp.kernel("summarize"))(doubled)

    assert tuple(mp.fetch(list(traced(x)))) == (6.0, 3)


def test_an_unbound_name_lists_what_the_node_offers(ctx: Context) -> None:
    x = mp.put("P0", np.arange(3.0))
    with pytest.raises(mp.RemoteError, match="'times' is not bound") as info:
        mp.fetch(mp.device("P0")(mp.kernel("times"))(x))  # bound on node1 only
    offered = info.value.remote_message.split("this node offers: ")[1]
    assert {"math.scale", "acme_kernels:scale", "stats.summary", "acme.summary"} <= set(
        offered.split(", ")
    )
    assert "mpl.io.read_npy" in offered  # mpl's own kernels, found through entry points
    assert "times" not in offered.split(", ") and "summarize" not in offered.split(", ")
    assert info.value.remote_type == "LookupError" and info.value.rank == 0


def test_code_kernels_refuses_pickled_code_before_unpickling(ctx: Context, tmp_path: Path) -> None:
    control = tmp_path / "unpickled-on-rank1"
    with pytest.raises(mp.RemoteError):  # rank 1 takes any code: it unpickles, then fails
        mp.fetch(mp.device("P1")(Trap(control))())
    assert control.exists()  # so the trap does fire when unpickled

    refused = tmp_path / "unpickled-on-rank0"
    with pytest.raises(mp.RemoteError, match="--code kernels") as info:
        mp.fetch(mp.device("P0")(Trap(refused))())
    assert info.value.remote_type == "PermissionError" and info.value.rank == 0
    assert isinstance(info.value, PermissionError)  # also catchable as PermissionError
    with pytest.raises(mp.RemoteError, match="the job's inputs") as info:
        mp.fetch(mp.device("P0")(mp.kernel("math.scale"))(Trap(refused)))  # a pickled input
    assert info.value.remote_type == "PermissionError"
    assert not refused.exists()  # nothing was unpickled on rank 0
    pickled_on_p1 = mp.device("P1")(mp.kernel("acme_kernels:boxed"))(1)  # a pickled value
    with pytest.raises(mp.RemotePermissionError, match="a value moved from rank 1"):
        mp.fetch(mp.device("P0")(mp.kernel("math.scale"))(pickled_on_p1))  # fails, not hangs
    x = mp.put("P0", np.arange(2.0))  # and it still runs what it allows
    np.testing.assert_array_equal(mp.fetch(mp.device("P0")(mp.kernel("math.scale"))(x)), [0, 2])


def test_io_kernels_stay_inside_the_data_root(ctx: Context, cluster: ProcessCluster) -> None:
    table = np.array([[1.0, 2.5], [3.0, 4.5]])
    written = mp.device("P0")(mp.kernel("mpl.io.write_csv"))("in/t.csv", table, header="a,b")
    back = mp.device("P0")(mp.kernel("mpl.io.read_csv"))(written, skip_header=1)
    np.testing.assert_array_equal(mp.fetch(back), table)
    assert (cluster.run_dir / "rank0" / "in" / "t.csv").read_text().startswith("a,b\n")
    saved = mp.device("P0")(mp.kernel("mpl.io.write_npy"))("arr", np.arange(4))
    np.testing.assert_array_equal(
        mp.fetch(mp.device("P0")(mp.kernel("mpl.io.read_npy"))(saved)), np.arange(4)
    )
    for path in ("../rank1/in/t.csv", str(cluster.run_dir / "rank0" / "in" / "t.csv")):
        with pytest.raises(mp.RemoteError, match="data root") as info:
            mp.fetch(mp.device("P0")(mp.kernel("mpl.io.read_csv"))(path))
        assert info.value.remote_type == "PermissionError"
    (cluster.run_dir / "rank0" / "link").symlink_to(cluster.run_dir / "rank1")
    with pytest.raises(mp.RemoteError, match="outside the worker's data root"):
        mp.fetch(mp.device("P0")(mp.kernel("mpl.io.read_npy"))("link/x.npy"))


def test_a_kernel_is_not_an_spu_function(ctx: Context) -> None:
    with pytest.raises(mp.DeviceError, match="named kernels run on a PPU"):
        mp.device("SP0")(mp.kernel("math.scale"))(mp.put("P0", 1))
    with pytest.raises(TypeError, match="runs on a worker"):
        mp.kernel("math.scale")(1)
