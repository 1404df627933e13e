"""``mpl-worker --code kernels`` holds in secure mode too (real daemons).

In secure mode a job's program and bindings reach the worker sealed: the outer message holds
no pickle to find, so the policy must be applied to what the seal holds, before anything in
it is unpickled. An allowed driver is still refused shipped code by a party that chose to
run only named kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deployment import Deployment
from test_secure import wait_up

import mpl.driver as mp

pytestmark = pytest.mark.daemons

KERNELS = """
import numpy as np


def scale(x):
    return np.asarray(x) * 2
"""


class Trap:
    """A "function" whose unpickling creates ``path``: proof of whether it was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))

    def __call__(self, *args: Any) -> Any:
        return None


@pytest.fixture
def deployment(deployment: Deployment) -> Deployment:
    """conftest's deployment, with the kernels module its workers import."""
    deployment.add_module("acme_scale", KERNELS)
    return deployment


def test_a_secure_worker_that_runs_only_kernels_refuses_sealed_pickles(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    d.start_broker()
    d.start_worker(0, extra=["--kernels", "acme_scale", "--code", "kernels"])
    d.start_worker(1)
    wait_up(d, range(2))
    refused = tmp_path / "unpickled-on-rank0"
    ctx = mp.connect(d.address, key=d.key("analyst"), cluster=d.spec)
    with ctx:
        with pytest.raises(mp.RemoteError, match="--code kernels") as info:
            mp.fetch(mp.device("P0")(Trap(refused))())  # a pickled function in the program
        assert info.value.remote_type == "PermissionError" and info.value.rank == 0
        with pytest.raises(mp.RemoteError, match="the job's inputs") as info:
            mp.fetch(mp.device("P0")(mp.kernel("acme_scale:scale"))(Trap(refused)))
        assert info.value.remote_type == "PermissionError"
        assert not refused.exists()  # nothing was unpickled on rank 0
        x = mp.put("P0", np.arange(2.0))  # and it still runs what it allows
        result = mp.fetch(mp.device("P0")(mp.kernel("acme_scale:scale"))(x))
        np.testing.assert_array_equal(result, [0, 2])
    ctx.close()
