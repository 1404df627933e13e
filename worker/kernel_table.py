"""The kernels a worker offers, and how a logical op's name finds one.

A kernel is a plain Python function a party's operator installed. It is known by a kernel
id, from two sources:

- installed packages, through Python entry points in the group ``mpl.kernels``: the entry
  point's name is the kernel id, its value ``"module:function"`` (mpl ships its own
  ``mpl.io.*`` kernels this way, see ``io_kernels.py``);
- ``mpl-worker --kernels MODULE``: the module's ``MPL_KERNELS`` mapping (kernel id ->
  function) if it has one, else each public function defined in it, as ``"MODULE:name"``.

``mp.kernel(name)`` resolves on each worker through its node's ``runtime_info.op_bindings``
(logical op -> kernel id); a name with no binding may name a kernel id directly. A name
that finds nothing fails with a ``LookupError`` listing what this node offers.

Whose bindings (:class:`NodeBindings`): a worker started with its own spec (``--cluster``,
secure mode) binds by that copy only; the broker's ``Welcome`` carries the broker's copy,
which a hostile broker operator could edit to point a logical op at another kernel of this
party. A Welcome that disagrees is counted (``bindings_overridden``) and logged once. A
worker without its own spec (plaintext) binds by the Welcome, as the broker is trusted there.

While a kernel runs, :func:`data_root` is the worker's ``--data-root``, so file kernels can
keep their paths inside it; :func:`driver_root` the folder of the job's driver there (a
secure worker's ``<data-root>/drivers/<name>``, by the driver that sealed the job: what one
driver's job writes, another's does not read; a plaintext worker's data root itself, as its
drivers are not authenticated); :func:`driver_quota` the bytes that folder may hold (a
secure worker's ``--driver-quota``); and :func:`runtime_info` is this node's ``runtime_info`` in
the job's session (the session's own spec's, else the cluster's).
"""

from __future__ import annotations

import contextvars
import copy
import importlib
import inspect
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mpl.wire.cluster import ClusterSpec
from mpl.wire.identity import driver_name
from mpl.wire.routing import check_driver_name
from mpl.wire.runtime_info import node_runtime_info

__all__ = [
    "DEFAULT_DRIVER_QUOTA",
    "DRIVERS",
    "ENTRY_POINT_GROUP",
    "SPU_LOG",
    "KernelTable",
    "NodeBindings",
    "data_root",
    "driver_quota",
    "driver_root",
    "module_kernels",
    "node_bindings",
    "runtime_info",
]

log = logging.getLogger("mpl.worker")

ENTRY_POINT_GROUP = "mpl.kernels"
_DATA_ROOT: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "mpl_data_root", default=None
)
_RUNTIME_INFO: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "mpl_runtime_info", default=None
)
# the driver that sealed the running kernel's job (secure mode; "": none known here), or
# None: a plaintext worker, whose drivers share the data root
_DRIVER: contextvars.ContextVar[str | None] = contextvars.ContextVar("mpl_driver", default=None)
DRIVERS = "drivers"  # <data-root>/drivers/<name>: each driver's own files (secure mode)
# The bytes one driver's folder may hold (mpl-worker --driver-quota): enough for a job's
# working files, small enough that one listed driver cannot fill a worker's disk alone.
DEFAULT_DRIVER_QUOTA = 1 << 30
# the running kernel's driver's folder's quota in bytes (0: none)
_QUOTA: contextvars.ContextVar[int] = contextvars.ContextVar("mpl_driver_quota", default=0)
SPU_LOG = "spu.log"  # <data-root>/spu.log: libspu's log, the worker's (no kernel reads it)


def data_root() -> Path:
    """The running worker's data root (only while a kernel runs)."""
    root = _DATA_ROOT.get()
    if root is None:
        raise RuntimeError("this worker has no data root (start it with --data-root)")
    return root


def driver_root() -> Path:
    """The folder of the running job's driver under the data root (only while a kernel
    runs): ``<data-root>/drivers/<name>`` on a secure worker, by the driver that sealed the
    job (made when first written to); the data root itself on a plaintext worker. Raises
    ``PermissionError`` on a secure worker for a job whose driver is not known here."""
    root = data_root()
    driver = _DRIVER.get()
    if driver is None:
        return root
    name = driver_name(driver) or ""
    try:
        return root / DRIVERS / check_driver_name(name)
    except ValueError:
        raise PermissionError(
            f"this job's driver ({driver or 'none known here'}) has no folder on this worker"
        ) from None


def driver_quota() -> int:
    """The bytes the running job's driver's folder (:func:`driver_root`) may hold, its
    files and folders each counted in whole 4 KiB blocks (only while a kernel runs; a
    secure worker's ``--driver-quota``; 0: no quota, as on a plaintext worker)."""
    return _QUOTA.get()


def runtime_info() -> dict[str, Any]:
    """This node's ``runtime_info`` in the running kernel's session (only while a kernel
    runs): ``version``, ``platform``, ``op_bindings`` and any other keys the spec gave it."""
    info = _RUNTIME_INFO.get()
    if info is None:
        raise RuntimeError("runtime_info() is known only while a kernel runs on a worker")
    # a deep copy: sessions bringing equal runtime_info share one kept copy
    # (worker/session_runtime.py), another driver's among them, so a kernel that changes
    # what it was given (a list, op_bindings) must change no other session's
    return copy.deepcopy(info)


def node_bindings(cluster: Mapping[str, Any], rank: int) -> dict[str, str]:
    """``op_bindings`` of node ``rank`` in a cluster spec's dict form ({} when absent)."""
    bindings = node_runtime_info(cluster, rank).get("op_bindings") or {}
    return {str(k): str(v) for k, v in bindings.items()}


class NodeBindings:
    """This node's op_bindings, for :class:`KernelTable`: from ``own`` (the worker's own
    spec) when there is one, else from the cluster the broker's last ``Welcome`` carried.

    Call :meth:`welcomed` with each Welcome's cluster: with an own spec it only compares
    (a disagreement is counted in ``overridden`` and logged the first time); without one
    the Welcome's bindings become this node's.
    """

    def __init__(self, rank: int, own: ClusterSpec | None = None) -> None:
        self.rank = rank
        self._own = dict(own.nodes[rank].runtime_info.op_bindings) if own is not None else None
        self._welcomed: dict[str, str] = {}
        self.overridden = 0  # Welcomes whose bindings for this node were not ours

    def welcomed(self, cluster: Mapping[str, Any]) -> None:
        theirs = node_bindings(cluster, self.rank)
        if self._own is None:
            self._welcomed = theirs
            return
        if theirs != self._own:
            self.overridden += 1
            if self.overridden == 1:
                log.warning(
                    "rank %d: the broker's op_bindings differ from this node's own spec "
                    "(%s, ours %s): using ours",
                    self.rank,
                    theirs,
                    self._own,
                )

    def __call__(self) -> dict[str, str]:
        return self._own if self._own is not None else self._welcomed

    def stats(self) -> dict[str, int]:
        return {"bindings_overridden": self.overridden}


def module_kernels(module_name: str) -> dict[str, Callable[..., Any]]:
    """The kernels ``mpl-worker --kernels MODULE`` registers (see the module docstring)."""
    module = importlib.import_module(module_name)
    declared = getattr(module, "MPL_KERNELS", None)
    if declared is not None:
        if not isinstance(declared, Mapping) or not all(
            isinstance(k, str) and callable(v) for k, v in declared.items()
        ):
            raise TypeError(f"{module_name}.MPL_KERNELS must map kernel ids to functions")
        return dict(declared)
    return {
        f"{module_name}:{name}": fn
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and not name.startswith("_") and fn.__module__ == module_name
    }


class KernelTable:
    """One worker's kernels: entry points (loaded on first use) and ``--kernels`` modules.

    ``bindings`` returns this node's current op_bindings (they come with the cluster spec);
    ``runtime`` this node's runtime_info in a session (see :func:`runtime_info`);
    ``per_driver``: a secure worker's, whose kernels see their job's driver's folder
    (:func:`driver_root`), holding at most ``quota`` bytes (:func:`driver_quota`; 0: no
    quota).
    """

    def __init__(
        self,
        bindings: Callable[[], Mapping[str, str]],
        modules: Sequence[str] = (),
        root: Path | None = None,
        runtime: Callable[[str], dict[str, Any]] | None = None,
        *,
        per_driver: bool = False,
        quota: int = DEFAULT_DRIVER_QUOTA,
    ) -> None:
        if quota < 0:
            raise ValueError(f"a driver's folder quota is a number of bytes >= 0, got {quota}")
        self._bindings = bindings
        self._quota = quota if per_driver else 0
        self._root = root
        self._runtime = runtime
        self._per_driver = per_driver
        self._lock = threading.Lock()
        self._entry_points: dict[str, Any] | None = None  # scanned on first use
        self._loaded: dict[str, Callable[..., Any]] = {}
        for module in modules:  # a module that does not import stops the worker at start
            self._loaded.update(module_kernels(module))

    def ids(self) -> list[str]:
        """Every kernel id installed here."""
        return sorted({*self._installed(), *self._loaded})

    def _installed(self) -> dict[str, Any]:
        # Scanning the installed packages costs milliseconds: not at start-up, only when asked.
        if self._entry_points is None:
            from importlib.metadata import entry_points  # ~30 modules: not on a plain start

            self._entry_points = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        return self._entry_points

    def offered(self) -> list[str]:
        """The names ``mp.kernel`` may use on this node: bound logical ops, and kernel ids."""
        ids = set(self.ids())
        bound = {name for name, kid in self._bindings().items() if kid in ids}
        return sorted(bound | ids)

    def resolve(self, name: str, session: str = "", sealer: str = "") -> Callable[..., Any]:
        """The function ``mp.kernel(name)`` runs here in ``session`` for a job ``sealer``
        sealed (secure mode; "" in plaintext), wrapped to see :func:`data_root`,
        :func:`driver_root` and :func:`runtime_info`."""
        bindings = self._bindings()
        kernel_id = bindings.get(name, name)
        fn = self._load(kernel_id)
        if fn is None:
            how = (
                f"is bound to {kernel_id!r}, which is not installed here"
                if (name in bindings)
                else "is not bound to a kernel here"
            )
            raise LookupError(
                f"kernel {name!r} {how}; this node offers: {', '.join(self.offered()) or 'nothing'}"
            )
        root = self._root
        info = self._runtime(session) if self._runtime is not None else {}
        driver = sealer if self._per_driver else None
        quota = self._quota

        def call(*args: Any, **kwargs: Any) -> Any:
            token = _DATA_ROOT.set(root)
            info_token = _RUNTIME_INFO.set(info)
            driver_token = _DRIVER.set(driver)
            quota_token = _QUOTA.set(quota)
            try:
                return fn(*args, **kwargs)
            finally:
                _QUOTA.reset(quota_token)
                _DRIVER.reset(driver_token)
                _RUNTIME_INFO.reset(info_token)
                _DATA_ROOT.reset(token)

        return call

    def _load(self, kernel_id: str) -> Callable[..., Any] | None:
        with self._lock:
            fn = self._loaded.get(kernel_id)
            if fn is not None:
                return fn
            ep = self._installed().get(kernel_id)
            if ep is None:
                return None
            loaded: Callable[..., Any] = ep.load()
            if not callable(loaded):
                raise TypeError(f"entry point {kernel_id!r} ({ep.value}) is not callable")
            self._loaded[kernel_id] = loaded
            return loaded
