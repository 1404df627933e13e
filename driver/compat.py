"""mplang's spellings of the entry points, so programs written for mplang run as they are.

==============================================  =============================================
mplang                                          here
==============================================  =============================================
``mp.make_simulator(n, cluster_spec=spec)``     ``mp.Simulator(spec or ClusterSpec.simple(n))``
``mp.make_driver(url, cluster_spec=spec)``      ``mp.connect(url)``, devices read from ``spec``
``mp.evaluate(ctx, fn, *args)`` (v1)            ``with ctx: fn(*args)``
``mp.evaluate(fn, *args, context=ctx)`` (v2)    the same
``mp.fetch(ctx, value)`` (v1)                   ``mp.fetch(value)`` (a Value knows its context)
``mp.set_root_context(ctx)``                    ``mp.set_context(ctx)``
``mp.get_dev_attr(v)`` / ``mp.is_device_obj``   ``v.device`` / ``isinstance(v, mp.Value)``
==============================================  =============================================

Each is a thin wrapper over the mpl call beside it; ``docs/from-mplang.md`` lists what
differs on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mpl.driver import devices
from mpl.driver.context import Context, connect, current, set_context
from mpl.driver.recorder import TRACES, TRACING
from mpl.driver.values import Value
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import ClusterSpecError

if TYPE_CHECKING:
    from mpl.driver.simulator import Simulator

__all__ = [
    "evaluate",
    "fetch",
    "get_dev_attr",
    "is_device_obj",
    "make_driver",
    "make_simulator",
    "set_root_context",
]


def make_simulator(
    world_size: int,
    *,
    cluster_spec: ClusterSpec | None = None,
    enable_tracing: bool = False,
    enable_profiling: bool = False,
    **options: Any,
) -> Simulator:
    """mplang's ``make_simulator``: an in-process cluster (``mp.Simulator``) of ``cluster_spec``,
    or of ``ClusterSpec.simple(world_size)``.

    Per-job traces are always kept here (``mp.trace(path)`` writes them), so
    ``enable_tracing`` and ``enable_profiling`` change nothing; other options go to
    :class:`mpl.driver.Simulator` (``timeout``, ``session``...).
    """
    from mpl.driver.simulator import Simulator

    spec = cluster_spec if cluster_spec is not None else ClusterSpec.simple(world_size)
    if spec.world_size != world_size:
        raise ClusterSpecError(
            f"world_size: {world_size} given, but cluster_spec has {spec.world_size} nodes"
        )
    return Simulator(spec, **options)


def make_driver(
    url_or_endpoints: str | Sequence[str],
    *,
    cluster_spec: ClusterSpec | None = None,
    **options: Any,
) -> Context:
    """mplang's ``make_driver``: a context on a running cluster (``mp.connect``).

    mplang's driver talks to every worker's HTTP endpoint; here one broker fronts the
    workers, so give its URL (``"tcp://host:5555"``; a bare ``"host:5555"`` gets ``tcp://``).
    A list holding one URL is accepted too. ``cluster_spec`` is the session's own spec, as
    ``mp.connect(url, cluster=...)``: its nodes are named nodes of the broker's cluster (any
    subset; each keeps the broker's rank) and its devices are the session's.
    Other options go to :func:`mpl.driver.connect` (``session``, ``timeout``, ``lease_s``).
    """
    if isinstance(url_or_endpoints, str):
        url = url_or_endpoints
    elif len(url_or_endpoints) == 1:
        url = url_or_endpoints[0]
    else:
        raise ValueError(
            "mpl reaches its workers through one broker: pass the broker's URL (e.g. "
            f"'tcp://127.0.0.1:5555'), not {len(url_or_endpoints)} worker endpoints"
        )
    if "://" not in url:
        url = f"tcp://{url}"
    if cluster_spec is not None:
        options["cluster"] = cluster_spec
    return connect(url, **options)


def evaluate(*args: Any, context: Context | None = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` in a context; mplang's two spellings both work:

    - v1: ``mp.evaluate(ctx, fn, *args)``;
    - v2: ``mp.evaluate(fn, *args, context=ctx)``, or without ``context`` in the current
      context (``with ctx:`` or ``mp.set_root_context(ctx)``).

    ``fn`` may be a plain function (each device call in it runs as it comes), an
    ``@mp.function`` (one job) or an ``mp.Program`` from ``mp.compile``. Returns what ``fn``
    returns: Values stay where they were computed until ``mp.fetch``.
    """
    if args and isinstance(args[0], Context):
        if context is not None:
            raise TypeError("evaluate: give the context either first or as context=, not both")
        context, args = args[0], args[1:]
    if not args or not callable(args[0]):
        raise TypeError("evaluate: expected a function to run, e.g. mp.evaluate(ctx, fn, *args)")
    fn: Callable[..., Any] = args[0]
    with context if context is not None else current():
        return fn(*args[1:], **kwargs)


def fetch(*args: Any, context: Context | None = None, timeout: float | None = None) -> Any:
    """Bring Values to the driver: ``mp.fetch(value)``, or mplang v1's ``mp.fetch(ctx, value)``.

    See :func:`mpl.driver.devices.fetch`: a PPU value comes back as is, a multi-party value
    as a list by rank, and an SPU value is reconstructed here, which REVEALS it to whoever
    runs the driver (mplang returned one share instead).
    """
    if len(args) == 1 and context is None:  # mp.fetch(value): no context to enter
        x = args[0]
        if type(x) is Value and not (TRACING[0] and TRACES.recorders):  # one, untraced
            return devices.fetch_one(x, timeout)
        return devices.fetch(x, timeout=timeout)
    if len(args) == 2 and isinstance(args[0], Context):
        context, args = args[0], args[1:]
    if len(args) != 1:
        raise TypeError("fetch: expected mp.fetch(value) or mp.fetch(ctx, value)")
    if context is None:
        return devices.fetch(args[0], timeout=timeout)
    with context:
        return devices.fetch(args[0], timeout=timeout)


def set_root_context(ctx: Context | None, force: bool = False) -> None:
    """mplang's ``set_root_context``: make ``ctx`` every thread's default context
    (``mp.set_context``). ``force`` is accepted for compatibility: replacing is always allowed."""
    del force
    set_context(ctx)


def get_dev_attr(obj: Any) -> str:
    """The device a Value lives on (``v.device``); mplang's spelling."""
    if not isinstance(obj, Value):
        raise TypeError(f"get_dev_attr: expected an mp.Value, got {type(obj).__name__}")
    if obj.device is None:
        raise ValueError(f"{obj!r} is a multi-party value with no device")
    return obj.device


def is_device_obj(obj: Any) -> bool:
    """True for a Value that lives on a device (mplang's spelling)."""
    return isinstance(obj, Value) and obj.device is not None
