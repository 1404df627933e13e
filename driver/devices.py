"""The device API: ``mp.device``, ``mp.put``, ``mp.fetch``, and moves between devices.

=============  =========================================================================
move           how
=============  =========================================================================
PPU -> PPU     a peer move (``shuffle``) from the owner to the target
PPU -> SPU     seal: the owner secret-shares it and sends each member its share
SPU -> PPU     reveal: every member sends its share to the target, which reconstructs
SPU -> SPU     not supported (``NotImplementedError``)
host -> PPU    a job input bound on that party only
host -> SPU    the driver makes the shares and binds one to each member
=============  =========================================================================
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from mpl.driver import context as _context
from mpl.driver import eager
from mpl.driver import spu as _spu
from mpl.driver.context import ENTERED, STACK, current
from mpl.driver.recorder import (
    TRACES,
    TRACING,
    Out,
    Recorder,
    active,
    call_template,
    cluster_now,
    emit,
)
from mpl.driver.tree import MANY_LEAVES, NO_ARGS, flatten_call, flatten_call_plain, tree_map
from mpl.driver.values import NOT_CACHED, Value
from mpl.wire.cluster import ClusterSpec, Device
from mpl.wire.errors import DeviceError, DeviceInferenceError, DeviceNotFoundError
from mpl.wire.kernels import KernelRef

__all__ = ["DeviceCall", "device", "fetch", "fetch_one", "getitem", "kernel", "move", "put"]


def _device(cluster: ClusterSpec, name: str) -> Device:
    try:
        return cluster.device(name)
    except KeyError:
        raise DeviceNotFoundError(
            f"no device {name!r} in cluster {cluster.cluster_id}; devices: "
            f"{', '.join(sorted(cluster.devices))}"
        ) from None


def infer_device(cluster: ClusterSpec, values: Sequence[Value]) -> str:
    """mplang's rules: the one device among the arguments, else the one secure device."""
    devices = sorted({v.device for v in values if v.device is not None})
    if not devices:
        raise DeviceInferenceError(
            "cannot infer a device: no argument lives on a device; name one, e.g. mp.device('P0')"
        )
    if len(devices) == 1:
        return devices[0]
    secure = [d for d in devices if _device(cluster, d).kind == "SPU"]
    if not secure:
        raise DeviceInferenceError(
            "cannot infer a device: arguments live on multiple PPU devices "
            f"({', '.join(devices)}); name the device that should run the function"
        )
    if len(secure) > 1:
        raise DeviceInferenceError(
            f"Ambiguous device: arguments live on several secure devices ({', '.join(secure)})"
        )
    return secure[0]


class _Site:
    """One decorated function's eager plan for calls without arguments, and the cluster it
    is for: such a call's plan key is that cluster alone, so the plan is found without
    flattening, building a key or looking it up (the plan stays in ``eager``'s cache too)."""

    __slots__ = ("bare",)

    def __init__(self) -> None:
        self.bare: tuple[ClusterSpec, eager.Plan] | None = None


class DeviceCall:
    """``mp.device(id)``: decorate a function to run on that device."""

    def __init__(self, dev_id: str | None, nout: int | None) -> None:
        if nout is not None and (not isinstance(nout, int) or nout < 0):
            raise ValueError(f"nout must be a non-negative int, got {nout!r}")
        self.dev_id = dev_id
        self.nout = nout

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise TypeError(f"mp.device(...) decorates a function, got {type(fn).__name__}")

        site = _Site()

        @functools.wraps(fn)
        def on_device(*args: Any, **kwargs: Any) -> Any:
            bare = site.bare
            if (
                bare is not None
                and not args
                and not kwargs
                and not (TRACING[0] and TRACES.recorders)
            ):
                # current(), its common cases read here (ENTERED: any thread's with ctx:;
                # else the default context, read from its module: a Python call less)
                contexts = STACK.contexts if ENTERED[0] else None
                ctx = contexts[-1] if contexts else (_context._default or current())
                if bare[0] is ctx.cluster:  # an eager call without arguments, planned
                    eager.stats["replayed"] += 1
                    outs = bare[1].run(ctx, [])
                    return outs[0] if self.nout is None else tuple(outs)
            return _call(self.dev_id, self.nout, fn, args, kwargs, site)

        return on_device

    @property
    def jax(self) -> DeviceCall:
        """mplang's ``mp.device("P0").jax(fn)``: the same call. A PPU runs any Python
        function, JAX included, and an SPU always compiles JAX."""
        return self

    def __repr__(self) -> str:
        return f"mp.device({self.dev_id!r}{'' if self.nout is None else f', nout={self.nout}'})"


def device(dev_id: str | None = None, *, nout: int | None = None) -> DeviceCall:
    """``mp.device("P0")(fn)(*args)`` runs ``fn`` on P0; ``mp.device()`` infers the device.

    Arguments living on other devices are moved first; host values are sent along. Outside
    ``@mp.function``, a small PPU value of another party whose data came back with its job
    is sent from the driver's copy instead of being moved between workers, so the call is
    one job on the callee alone. Returns one :class:`Value`, or a tuple of ``nout`` Values.
    """
    return DeviceCall(dev_id, nout)


def _call(
    dev_id: str | None,
    nout: int | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    site: _Site | None = None,
) -> Any:
    cluster = cluster_now()
    leaves, treedef = flatten_call(args, kwargs)
    name = dev_id or infer_device(cluster, [v for v in leaves if isinstance(v, Value)])
    dev = _device(cluster, name)
    if dev.kind == "SPU" and isinstance(fn, KernelRef):
        raise DeviceError(
            f"{fn.__name__} cannot run on SPU {dev.name}: named kernels run on a PPU; "
            "an SPU runs a JAX function"
        )
    if dev.kind == "SPU":
        outs = _spu.run(cluster, dev, fn, leaves, treedef, nout)
    else:
        if isinstance(fn, KernelRef):
            fn = _session_binding(cluster, dev, fn)
        if len(leaves) > MANY_LEAVES:  # long plain lists: one input each, not one an item
            leaves, treedef = flatten_call_plain(args, kwargs)
        outs = _ppu_call(cluster, dev, fn, leaves, treedef, nout, site)
    return outs[0] if nout is None else tuple(outs)


def _ppu_call(
    cluster: ClusterSpec,
    dev: Device,
    fn: Callable[..., Any],
    leaves: list[Any],
    treedef: Any,
    nout: int | None,
    site: _Site | None = None,
) -> list[Value]:
    def build(rec: Recorder, leaf_done: Callable[[int], None] = lambda i: None) -> list[Out]:
        rank = cluster.ranks(dev.name)[0]  # worked out when recording, not per replay
        position = iter(range(len(leaves)))

        def on_value(v: Value) -> int:
            sym = rec.copy(v, rank) if _driver_holds(rec, v, rank) else move(rec, v, dev.name)
            leaf_done(next(position))
            return sym

        def on_host(x: Any) -> int | None:
            sym = rec.host(x, (rank,))  # a job input on that party only
            leaf_done(next(position))
            return sym

        inputs, targs, tkwargs = call_template(leaves, treedef, on_value, on_host)
        outs = rec.op(
            "pcall",
            inputs,
            ranks=(rank,),
            nout=1 if nout is None else nout,
            fn=rec.fn(fn),
            args=targs,
            kwargs=tkwargs,
            name=_name(fn),
        )
        return [(o, dev.name) for o in outs]

    if active() is None:  # eager: replay the plan of an earlier identical call if any
        ctx = current()
        key = eager.plan_key(ctx, dev.name, nout, fn, treedef, leaves)
        if key is not None:
            plan = eager.lookup(key, cluster) or eager.record(key, ctx, _name(fn), build)
            if plan is not None:
                if site is not None and treedef is NO_ARGS:
                    site.bare = (cluster, plan)
                return plan.run(ctx, leaves)
    return emit(build, name=_name(fn))


def _driver_holds(rec: Recorder, value: Value, rank: int) -> bool:
    """Whether an eager call may bind ``value`` on ``rank`` from the driver's own copy
    instead of moving it there from the party holding it.

    Only for a value one PPU holds whose small result came back with its job (so the
    driver already has it: nothing is disclosed that was not), going to another party.
    Binding the copy makes the call a job on ``rank`` alone: no move between workers, no
    waiting for the other party. Traced programs always move (their graph is reused for
    values the driver does not hold).
    """
    if rec.traced or value._recorder is not None or value._ctx is not rec.ctx:
        return False  # the move's own checks refuse values of traces and other contexts
    if len(value.parties) != 1 or value.parties == (rank,):
        return False
    if value.device is None or _device(rec.cluster, value.device).kind != "PPU":
        return False
    return value.cached(value.parties[0]) is not NOT_CACHED


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or "fn")


def move(rec: Recorder, value: Value, target: str) -> int:
    """The symbol of ``value`` once it is on device ``target`` (moving it if needed)."""
    sym = rec.of(value)
    if value.device == target:
        return sym
    cluster = rec.cluster
    dst = _device(cluster, target)
    src_kind = _device(cluster, value.device).kind if value.device else "simp"
    if dst.kind == "SPU":
        if src_kind == "SPU":
            raise NotImplementedError(
                f"moving a secret value from {value.device} to {target} (SPU to SPU re-sharing) "
                "is not supported; reveal it to a PPU first if the parties agree"
            )
        return _spu.seal(rec, sym, value, dst)
    rank = cluster.ranks(target)[0]
    if src_kind == "SPU":
        return _spu.reveal(rec, sym, value, rank)
    if value.parties == (rank,):
        return sym
    source = value.parties[0] if rank not in value.parties else rank
    return rec.op("shuffle", [sym], ranks=(source, rank), routing={rank: source})[0]


def _session_binding(cluster: ClusterSpec, dev: Device, ref: KernelRef) -> KernelRef:
    """``ref`` as the session's spec binds it on ``dev``'s node: a session opened with its
    own spec (``mp.connect(url, cluster=spec)``) brings its nodes' ``op_bindings``, which
    the workers (who bind by the broker's spec) do not know, so the kernel id is sent
    instead. A worker runs any installed kernel by id anyway: this grants nothing more."""
    bound = cluster.node(dev.members[0]).runtime_info.op_bindings.get(ref.name)
    return KernelRef(bound) if bound else ref


def kernel(name: str) -> KernelRef:
    """A call of the logical op ``name``, usable wherever a function is:
    ``mp.device("P0")(mp.kernel("io.read_table"))(path)``, eager or inside ``@mp.function``,
    with ``nout`` as for any function.

    No code travels: each worker runs the kernel its node binds ``name`` to in
    ``runtime_info.op_bindings`` (or the kernel with that id) among those its operator
    installed (``mpl.kernels`` entry points, ``mpl-worker --kernels MODULE``). A name the
    node cannot resolve fails with a ``RemoteError`` listing what it offers.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"mp.kernel takes a kernel name, got {name!r}")
    return KernelRef(name)


def put(dev_id: str, x: Any) -> Value:
    """Place a host value on a device, or move a Value there (see the module table)."""
    cluster = cluster_now()
    dev = _device(cluster, dev_id)
    if isinstance(x, Value):
        return emit(lambda rec: [(move(rec, x, dev_id), dev_id)], name=f"put {dev_id}")[0]
    if dev.kind == "SPU":
        return _spu.put_host(cluster, dev, x)
    rank = cluster.ranks(dev_id)[0]
    return emit(lambda rec: [(rec.host(x, (rank,)), dev_id)], name=f"put {dev_id}")[0]


def getitem(value: Value, key: Any) -> Value:
    """``value[key]`` computed where the value lives."""
    if value.device is not None and cluster_now().device(value.device).kind == "SPU":
        return _spu.getitem(value, key)
    return emit(
        lambda rec: [
            (rec.op("getitem", [rec.of(value)], ranks=value.parties, key=key)[0], value.device)
        ],
        name="getitem",
    )[0]


def fetch(x: Any, *, timeout: float | None = None) -> Any:
    """Bring Values (anywhere in lists, tuples, dicts) to the driver.

    A PPU value comes back as is. A multi-party value comes back as a list by rank, with
    None where a rank holds nothing. An SPU value is reconstructed here: that reveals the
    secret to whoever runs the driver. Inside ``@mp.function`` it returns its input.
    """
    if TRACING[0] and TRACES.recorders:  # active()
        return x
    if type(x) is Value:  # the common case: one Value, no tree to walk
        return fetch_one(x, timeout)
    return tree_map(lambda leaf: fetch_one(leaf, timeout), x)


# world size -> all its ranks in order, and what reads each one's from a dict (at most one
# per world size in use)
_EVERY_RANK: dict[int, tuple[tuple[int, ...], Callable[[dict[int, Any]], Any]]] = {}


def _every_rank(world: int) -> tuple[tuple[int, ...], Callable[[dict[int, Any]], Any]]:
    ranks = tuple(range(world))
    every = _EVERY_RANK[world] = (ranks, itemgetter(*ranks))  # (a tuple: world > 1)
    return every


def fetch_one(value: Any, timeout: float | None) -> Any:
    """:func:`fetch` of one leaf, outside a trace (``mp.fetch`` calls it for one Value)."""
    if not isinstance(value, Value):
        return value
    if value._recorder is not None:  # value.traced
        raise DeviceError("cannot fetch a traced value outside its @mp.function")
    ctx = value._ctx if value._ctx is not None else current()
    # the devices table read directly (cluster.device, which explains a missing name, only
    # for a name it lacks): this runs once per fetched Value
    device = value.device and (
        ctx.cluster.devices.get(value.device) or ctx.cluster.device(value.device)
    )
    if device and device.kind == "SPU":
        return _spu.fetch(ctx, value, timeout)
    cache = value._cache  # what came back with the job (value.cached, read directly)
    parties = value.parties
    if len(parties) == 1:  # a device's value: as it is
        rank = parties[0]
        got = cache.get(rank, NOT_CACHED)
        return got if got is not NOT_CACHED else ctx.fetch_raw(rank, value._uri, timeout=timeout)
    # a list by rank (cluster.world_size of them)
    world = len(ctx.cluster.nodes)
    if len(parties) == world > 1:
        every = _EVERY_RANK.get(world) or _every_rank(world)
        if parties == every[0]:
            try:  # every rank's came back (a fan-out's): read in C, without a Python loop
                return list(every[1](cache))
            except KeyError:
                pass
    by_rank: list[Any] = [None] * world  # filled in place: no dict by rank between
    for rank in parties:
        got = cache.get(rank, NOT_CACHED)
        by_rank[rank] = (
            got if got is not NOT_CACHED else ctx.fetch_raw(rank, value._uri, timeout=timeout)
        )
    return by_rank
