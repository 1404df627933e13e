"""KernelTable on its own: where kernels come from and what an unresolved name says."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpl.wire import ClusterSpec
from mpl.worker.kernel_table import (
    KernelTable,
    NodeBindings,
    data_root,
    module_kernels,
    node_bindings,
)


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "declared_k.py").write_text(
        "from mpl.worker.kernel_table import data_root\n\n"
        "def _impl(x):\n    return x + 1\n\n"
        "MPL_KERNELS = {'acme.inc': _impl, 'acme.where': data_root}\n"
    )
    (tmp_path / "plain_k.py").write_text(
        "from os.path import join\n\ndef double(x):\n    return 2 * x\n\n"
        "def _hidden(x):\n    return x\n"
    )
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("declared_k", "plain_k"):
        sys.modules.pop(name, None)


def test_modules_register_declared_or_public_functions(modules: Path) -> None:
    assert list(module_kernels("declared_k")) == ["acme.inc", "acme.where"]
    assert list(module_kernels("plain_k")) == ["plain_k:double"]  # not imports, not _private


def test_resolution_through_bindings_and_what_a_miss_lists(modules: Path) -> None:
    bindings = {"inc": "acme.inc", "gone": "acme.missing"}
    table = KernelTable(lambda: bindings, ["declared_k", "plain_k"], root=modules)
    assert table.resolve("inc")(1) == 2
    assert table.resolve("plain_k:double")(4) == 8  # a kernel id works without a binding
    assert table.resolve("acme.inc")(0) == 1
    with pytest.raises(LookupError, match=r"'gone' is bound to 'acme\.missing', which is not"):
        table.resolve("gone")
    with pytest.raises(LookupError, match=r"this node offers: .*inc") as info:
        table.resolve("nope")
    assert "gone" not in str(info.value).split("offers: ")[1].split(", ")
    assert "mpl.io.write_csv" in table.offered()  # mpl's own, from its entry points


def test_a_kernel_sees_the_data_root_only_while_it_runs(modules: Path) -> None:
    table = KernelTable(lambda: {"where": "acme.where"}, ["declared_k"], root=modules)
    assert table.resolve("where")() == modules
    with pytest.raises(RuntimeError, match="no data root"):
        data_root()


def test_node_bindings_reads_the_spec_dict() -> None:
    spec = {"nodes": [{"name": "a"}, {"name": "b", "runtime_info": {"op_bindings": {"x": "y"}}}]}
    assert node_bindings(spec, 1) == {"x": "y"}
    assert (
        node_bindings(spec, 0) == {} and node_bindings(spec, 5) == {} and node_bindings({}, 0) == {}
    )


def test_node_bindings_follow_the_welcome_only_without_an_own_spec() -> None:
    ours = ClusterSpec.simple(2, op_bindings=[{}, {"read": "mpl.io.read_npy"}])
    theirs = ClusterSpec.simple(2, op_bindings=[{}, {"read": "mpl.io.write_npy"}]).to_dict()
    plain = NodeBindings(1)
    plain.welcomed(theirs)
    assert plain() == {"read": "mpl.io.write_npy"} and plain.stats() == {"bindings_overridden": 0}
    own = NodeBindings(1, ours)
    for _ in range(3):  # every disagreeing Welcome counts; an agreeing one does not
        own.welcomed(theirs)
    own.welcomed(ours.to_dict())
    assert own() == {"read": "mpl.io.read_npy"} and own.overridden == 3
