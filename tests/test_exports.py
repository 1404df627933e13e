"""Every part's public names: ``__all__`` is complete and resolvable, and the driver
exports exactly the API ARCHITECTURE.md section 2 names."""

from __future__ import annotations

import importlib
import inspect

import pytest

PARTS = ["mpl.wire", "mpl.broker", "mpl.worker", "mpl.driver"]

# ARCHITECTURE.md section 2, as `mp.<name>` is written there.
ARCHITECTURE_NAMES = {
    "ClusterSpec",
    "Simulator",
    "local_cluster",
    "connect",
    "set_context",
    "device",
    "put",
    "fetch",
    "Value",
    "function",
    "compile",
    "Program",
    "simp",
    "collective",
    "save",
    "load",
    "delete",
    "trace",
    "DeviceError",
    "DeviceNotFoundError",
    "DeviceInferenceError",
}


@pytest.mark.parametrize("name", PARTS)
def test_all_is_unique_and_resolvable(name: str) -> None:
    module = importlib.import_module(name)
    names = list(module.__all__)  # ruff (RUF022) keeps it sorted
    assert len(names) == len(set(names))
    for n in names:
        assert getattr(module, n) is not None, n


@pytest.mark.parametrize("name", PARTS)
def test_all_lists_every_public_name(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and not inspect.ismodule(v)
        and n != "annotations"
        and getattr(v, "__module__", name).startswith("mpl.")
    }
    public |= {n for n, v in vars(module).items() if inspect.ismodule(v) and n in module.__all__}
    assert public <= set(module.__all__), public - set(module.__all__)


def test_driver_exports_the_architecture_api() -> None:
    import mpl.driver as mp

    assert set(mp.__all__) >= ARCHITECTURE_NAMES
    for n in ("pcall", "shuffle", "converge", "constant"):
        assert callable(getattr(mp.simp, n))
    for n in ("transfer", "replicate", "distribute", "collect", "allreplicate", "permute"):
        assert callable(getattr(mp.collective, n))
    assert issubclass(mp.DeviceNotFoundError, mp.DeviceError)
    assert callable(mp.ClusterSpec.simple) and callable(mp.Simulator.simple)
