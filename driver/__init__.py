"""mpl.driver: write one program, run it across parties.

    import mpl.driver as mp

    with mp.local_cluster(2) as ctx:            # or mp.Simulator.simple(2), mp.connect(url)
        x = mp.device("P0")(load_alice)()       # runs on party P0; x stays there
        y = mp.device("P1")(load_bob)()
        z = mp.device("SP0")(lambda a, b: a < b)(x, y)   # MPC: neither sees the other's data
        print(mp.fetch(mp.put("P0", z)))        # reveal to P0, then bring it here

Modules: contexts (``context``), values (``values``), the device API (``devices``), traced
programs (``programs``, over ``recorder``), jobs in flight (``futures``, over ``inflight``),
the party API (``simp``) and collectives (``collective``), named values (``names``), SPU
support (``spu``), trace files (``tracefile``), progress of running jobs (``job_progress``),
and mplang's spellings of the entry points (``compat``: ``evaluate``, ``make_simulator``,
``make_driver``...). The low-level ``client`` speaks the wire protocol; ``simulator`` and
``launcher`` are the only modules that start broker and worker code, and they are imported
on first use.
"""

from __future__ import annotations

from typing import Any

from mpl.driver import admin as _admin
from mpl.driver import collective, simp
from mpl.driver.admin import close_session, sessions, symbols
from mpl.driver.compat import (
    evaluate,
    fetch,
    get_dev_attr,
    is_device_obj,
    make_driver,
    make_simulator,
    set_root_context,
)
from mpl.driver.context import Context, Status, connect, get_context, set_context
from mpl.driver.devices import device, kernel, put
from mpl.driver.futures import as_completed, submit, wait
from mpl.driver.job_progress import progress
from mpl.driver.names import delete, load, save
from mpl.driver.programs import Function, Program, compile, function
from mpl.driver.values import Value
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import pickle_by_value
from mpl.wire.errors import (
    AuthenticationError,
    ClusterSpecError,
    DeviceError,
    DeviceInferenceError,
    DeviceNotFoundError,
    GraphError,
    JobAbortedError,
    KeyFileError,
    MessageTooLargeError,
    MplError,
    MplTimeoutError,
    ProtocolError,
    RemoteError,
    RemotePermissionError,
    SessionError,
    UnsafeValueError,
    WorkerLostError,
)

# the function shadows the submodule of the same name (importing it set the attribute)
programs = _admin.programs

__all__ = [
    "AuthenticationError",
    "ClusterSpec",
    "ClusterSpecError",
    "Context",
    "DeviceError",
    "DeviceInferenceError",
    "DeviceNotFoundError",
    "Function",
    "GraphError",
    "JobAbortedError",
    "KeyFileError",
    "LocalCluster",
    "MessageTooLargeError",
    "MplError",
    "MplTimeoutError",
    "Program",
    "ProtocolError",
    "RemoteError",
    "RemotePermissionError",
    "SessionError",
    "Simulator",
    "Status",
    "UnsafeValueError",
    "Value",
    "WorkerLostError",
    "as_completed",
    "close_session",
    "collective",
    "compile",
    "connect",
    "delete",
    "device",
    "evaluate",
    "fetch",
    "function",
    "get_context",
    "get_dev_attr",
    "is_device_obj",
    "kernel",
    "load",
    "local_cluster",
    "make_driver",
    "make_simulator",
    "pickle_by_value",
    "programs",
    "progress",
    "put",
    "save",
    "sessions",
    "set_context",
    "set_root_context",
    "simp",
    "submit",
    "symbols",
    "trace",
    "wait",
]


def trace(path: str, *, last: int | None = None) -> str:
    """Write a Chrome/Perfetto trace of the current context's last jobs (or the ``last``
    few) to ``path``."""
    from mpl.driver.context import current

    return current().trace(path, last=last)


_LAZY = {
    "Simulator": "mpl.driver.simulator",
    "LocalCluster": "mpl.driver.launcher",
    "local_cluster": "mpl.driver.launcher",
}


def __getattr__(name: str) -> Any:
    # The in-process runtime and the process launcher pull in the broker and worker code:
    # load them when first used, so `import mpl.driver` stays light.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mpl.driver' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
