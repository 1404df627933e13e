"""Shared fixtures: in-process clusters (inproc://) and real daemons on loopback (tcp://).

Every process a test starts is stopped by its pid in teardown, every socket has a bounded
LINGER, and waits poll with a deadline instead of sleeping.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_ENABLE_X64", "1")

import pytest

from mpl.driver.client import Client
from mpl.driver.launcher import ProcessCluster
from mpl.driver.simulator import InProcessCluster
from mpl.wire import ClusterSpec, hot
from mpl.wire.codec import pickle_by_value

sys.path.insert(0, str(Path(__file__).parent))
import helpers
from deployment import Deployment

pickle_by_value(helpers)  # workers do not have the tests package: ship these functions


# -- no driver thread outlives the test that started it -------------------------------------
# ``with mp.connect(...)`` and ``with mp.Simulator(...)`` only make a context current: a
# test that never closes it leaves its client's threads (and sockets) running for the rest
# of the session. A module's or the session's fixture may keep a context across its tests:
# the threads started while such a fixture is set up are its own, and so are those its
# client starts later (the job pump starts with the first job submitted ahead).
_DRIVER_THREADS = "mpl-driver-"  # the client's pump and heartbeat threads
_FIXTURES_OWN: set[threading.Thread] = set()
_FIXTURE_CLIENTS: list[Client] = []
_LEFT_WITHIN_S = 10.0  # a client's close joins each of its threads for at most 5 s


def _driver_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(_DRIVER_THREADS)}


def _client_of(value: Any) -> Client | None:
    """The driver client a fixture's value holds: a client, or a context's."""
    client = value if isinstance(value, Client) else getattr(value, "client", None)
    return client if isinstance(client, Client) else None


def _fixtures_own() -> set[threading.Thread]:
    """The driver threads of wider-scoped fixtures (their clients' pump among them)."""
    own = set(_FIXTURES_OWN)
    for client in _FIXTURE_CLIENTS:
        own.add(client.watch._thread)
        if client._pump is not None:
            own.add(client._pump._thread)
    return own


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Iterator[Any]:
    if fixturedef.scope == "function":
        return (yield)
    before = _driver_threads()
    try:
        value = yield
    finally:
        _FIXTURES_OWN.update(_driver_threads() - before)
    values = value if isinstance(value, tuple) else (value,)
    _FIXTURE_CLIENTS.extend(c for v in values if (c := _client_of(v)) is not None)
    return value


@pytest.fixture(autouse=True)
def no_driver_thread_left() -> Iterator[None]:
    """Fails the test that leaves a driver thread of its own running once it and its
    fixtures are done (set up first, so torn down last)."""
    before = _driver_threads()
    yield
    deadline = time.monotonic() + _LEFT_WITHIN_S
    while left := _driver_threads() - before - _fixtures_own():
        if time.monotonic() > deadline:
            names = sorted(t.name for t in left)
            pytest.fail(f"the test left driver threads running: {names} (close its contexts)")
        time.sleep(0.02)
    alive = _driver_threads()  # what ended is forgotten
    _FIXTURES_OWN.intersection_update(alive)
    _FIXTURE_CLIENTS[:] = [c for c in _FIXTURE_CLIENTS if c.watch._thread in alive]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """A secure deployment's files in ``tmp_path`` (``tests/deployment.py``: keys, the
    cluster spec); the daemons a test starts from it are stopped by pid at its end. A
    module that needs more (a kernels module) asks for this one in its own."""
    with contextlib.closing(Deployment(tmp_path)) as made:
        yield made


@pytest.fixture
def zmq_ctx() -> Iterator[Any]:
    """A ZeroMQ context of the test's own, destroyed (every socket with LINGER 0) at the end."""
    import zmq

    context: Any = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


@pytest.fixture
def nesting_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the lean readers' walks over a message's containers (``check_nesting``)."""
    walks: list[int] = []
    real = hot.check_nesting  # type: ignore[attr-defined]  # the decoder's, as hot calls it

    def counted(items: Any) -> None:
        walks.append(1)
        real(items)

    monkeypatch.setattr(hot, "check_nesting", counted)
    return walks


class Cluster:
    """One cluster under test, whichever transport it runs on."""

    def __init__(self, kind: str, impl: InProcessCluster | ProcessCluster) -> None:
        self.kind = kind
        self.impl = impl
        self.address = impl.address
        self.clients: list[Client] = []

    def client(self, **kw: Any) -> Client:
        ctx = self.impl.ctx if isinstance(self.impl, InProcessCluster) else None
        c = Client(self.address, context=ctx, **kw)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.impl.close()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(kind: str, world_size: int = 2, **kw: Any) -> Cluster:
        spec = kw.pop("spec", None) or ClusterSpec.simple(world_size, enable_spu=False)
        if kind == "inproc":
            impl: Any = InProcessCluster(spec, data_root=tmp_path / f"sim{len(made)}", **kw)
        else:
            impl = ProcessCluster(spec, run_dir=tmp_path / f"run{len(made)}", **kw)
        cluster = Cluster(kind, impl)
        made.append(cluster)
        return cluster

    yield make
    for c in made:
        c.close()


@pytest.fixture(params=["inproc", "tcp"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- one program under the in-process Simulator and under real daemons ----------------------
# A module sets WORLD_SIZE (default 3); ``ctx`` runs each test once per kind of cluster.


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest) -> Iterator[Any]:
    import mpl.driver as mp

    ctx = mp.Simulator.simple(getattr(request.module, "WORLD_SIZE", 3))
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def procs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    import mpl.driver as mp

    n = getattr(request.module, "WORLD_SIZE", 3)
    with mp.local_cluster(n, run_dir=tmp_path_factory.mktemp("lc")) as ctx:
        yield ctx


@pytest.fixture(params=["sim", "procs"])
def ctx(request: pytest.FixtureRequest) -> Iterator[Any]:
    context = request.getfixturevalue(request.param)
    with context:
        yield context
