"""``@mp.function`` and ``mp.compile``: trace a Python function into ONE graph, run it as
ONE job (one driver -> broker -> workers round trip, whatever the number of ops).

Tracing records placements, not data: Python control flow on the driver is unrolled, host
values (and the shares of ``mp.put`` on an SPU) become job inputs bound on the ranks that use
them, never constants of the graph every rank receives, and Values reached through closures
become inputs. A traced program is cached per argument structure, placement and host values,
and runs its synchronous jobs through a call site compiled for its context
(:mod:`mpl.driver.job_site`: the Exec packed once, the round trip in one function).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from mpl.driver import context as _context
from mpl.driver.context import ENTERED, STACK, Context, current
from mpl.driver.job_site import JobSite
from mpl.driver.recorder import TRACES, TRACING, Ranks, Recorder, bind, tracing, wrap
from mpl.driver.tree import LEAF, NO_ARGS, flatten, flatten_call, unflatten
from mpl.driver.values import Value, output_value
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import MplError
from mpl.wire.graph import Graph, format_graph
from mpl.wire.jobs import JobResult, output_uri
from mpl.wire.lru import LRU

__all__ = ["Function", "Program", "compile", "function"]

_TRACES = 64  # programs cached per function
_FIRST_OUTPUT = output_uri("", 0)  # a job's first output is its id and this
assert output_uri("job", 0) == "job" + _FIRST_OUTPUT


class Program:
    """A traced graph plus how to bind its inputs and rebuild its outputs."""

    def __init__(
        self,
        name: str,
        rec: Recorder,
        graph: Graph,
        outputs: list[int],
        params: list[int],
        out_tree: Any,
        outs: list[tuple[str, Any, str | None]],
    ) -> None:
        self.name = name
        self.graph = graph
        self._sources = list(rec.sources)
        self._captured = list(rec._held)  # Values read through closures stay alive with us
        self._inputs = bool(self._sources or self._captured)
        self._params = params  # leaf positions of the Value arguments
        self._out_tree = out_tree
        self._outs = outs  # per output leaf: ("v", output index, device) | ("h", host value, None)
        # what every run asks for and rebuilds its outputs with: worked out once, not per call
        self._inline = tuple(range(len(graph.outputs)))
        devices: list[str | None] = [None] * len(graph.outputs)
        for kind, index, device in outs:
            if kind == "v":
                devices[index] = device
        self._out_devices = [(-1, d) for d in devices]
        self._out_placements = [graph.placements[v] for v in graph.outputs]
        self._site: JobSite | None = None  # its synchronous jobs, compiled for one context
        # (device, ranks) when the function returns exactly one Value, its only output
        self._single: tuple[str | None, Ranks] | None = None
        if out_tree == LEAF and len(outs) == 1 and outs[0][0] == "v" and len(graph.outputs) == 1:
            self._single = (outs[0][2], self._out_placements[0])

    def __str__(self) -> str:
        return format_graph(self.graph)

    def __repr__(self) -> str:
        return f"<mp.Program {self.name}: {len(self.graph.ops)} ops>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(current(), args, kwargs)

    def run(
        self,
        ctx: Context,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        leaves: list[Any] | None = None,
    ) -> Any:
        """Run as one job in ``ctx`` and wait: the outputs, as the traced function returned
        them. ``leaves`` are the flattened ``(args, kwargs)`` when the caller has them."""
        # no inputs (no parameters, nothing captured): nothing to bind or check
        bindings = self._bind(ctx, args, kwargs, leaves) if self._inputs else {}
        site = self._site
        if site is None or site.ctx is not ctx:
            site = self._site = JobSite(ctx, self.graph, self._inline)
        job, values, metas = site.run(bindings)
        if self._single is None:
            return self._built(ctx, job, values, metas)
        device, ranks = self._single  # one Value (_built's first case, written out)
        return output_value(
            device, ranks, ctx, job + _FIRST_OUTPUT, values.get(0), metas.get(0, "")
        )

    def submit(
        self,
        ctx: Context,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        leaves: list[Any] | None = None,
    ) -> Future[Any]:
        """Start as one job in ``ctx`` without waiting: a future of what ``run`` returns."""
        bindings = self._bind(ctx, args, kwargs, leaves) if self._inputs else {}
        # one Value: built straight from the answer on the pump (_built's first case)
        outputs = self._outputs if self._single is None else self._single_output
        return ctx.submit(
            self.graph,
            bindings,
            functools.partial(outputs, ctx),
            # the input Values outlive the job: no delete overtakes it
            keep=(args, kwargs) if args or kwargs else None,
            inline=self._inline,
        )

    def _bind(
        self,
        ctx: Context,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        leaves: list[Any] | None = None,
    ) -> dict[int, list[Any]]:
        if not self._inputs:  # nothing to bind or check
            return {}
        if leaves is None:
            leaves, _ = flatten((args, kwargs))
        params = [leaves[i] for i in self._params]
        for v in [*params, *self._captured]:
            if not isinstance(v, Value) or v._ctx is not ctx:
                raise MplError(f"{v!r} is not a value of the context running {self.name}")
        slots: list[Value | None] = []
        it = iter(params)
        for kind, _, _ in self._sources:
            slots.append(next(it) if kind == "param" else None)
        return bind(self._sources, self.graph.world_size, slots)

    def _outputs(self, ctx: Context, result: JobResult) -> Any:
        return self._built(ctx, result.job, result.values, result.metas)

    def _single_output(self, ctx: Context, result: JobResult) -> Value:
        """:meth:`_outputs` of a function that returns one Value (``_single``), without
        :meth:`_built`'s call."""
        assert self._single is not None
        device, ranks = self._single
        return output_value(
            device,
            ranks,
            ctx,
            result.job + _FIRST_OUTPUT,
            result.values.get(0),
            result.metas.get(0, ""),
        )

    def _built(
        self, ctx: Context, job: str, got: dict[int, dict[int, Any]], metas: dict[int, str]
    ) -> Any:
        """The outputs of ``job`` as the traced function returned them (``got``, ``metas``:
        its JobResult's ``values`` and ``metas``)."""
        if self._single is not None:  # the function returned one Value: no tree to rebuild
            device, ranks = self._single
            return output_value(
                device, ranks, ctx, job + _FIRST_OUTPUT, got.get(0), metas.get(0, "")
            )
        values = wrap(ctx, job, self._out_devices, self._out_placements, got, metas)
        out = [values[index] if kind == "v" else index for kind, index, _ in self._outs]
        return unflatten(self._out_tree, out)


def _trace(
    fn: Callable[..., Any],
    cluster: ClusterSpec,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: str,
) -> Program:
    rec = Recorder(cluster, traced=True, name=name)
    leaves, treedef = flatten((args, kwargs))
    params: list[int] = []
    traced_leaves: list[Any] = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, Value):
            if leaf.traced:
                raise MplError("a traced value cannot be an argument of a new trace")
            traced_leaves.append(rec.traced_value(rec.param(leaf.parties), leaf.device))
            params.append(i)
        else:
            traced_leaves.append(leaf)
    targs, tkwargs = unflatten(treedef, traced_leaves)
    with tracing(rec):
        result = fn(*targs, **tkwargs)
    out_leaves, out_tree = flatten(result)
    outputs: list[int] = []
    outs: list[tuple[str, Any, str | None]] = []
    for leaf in out_leaves:
        if isinstance(leaf, Value):
            outputs.append(rec.of(leaf))  # a captured concrete Value becomes an input
            outs.append(("v", len(outputs) - 1, leaf.device))
        else:
            outs.append(("h", leaf, None))
    graph = rec.builder.build(outputs)
    return Program(name, rec, graph, outputs, params, out_tree, outs)


def _key(leaves: list[Any], treedef: Any, cluster: ClusterSpec) -> Any:
    """What a cached trace is looked up by: the arguments' structure, each Value's device and
    parties, each hashable host value (with its type), and the cluster."""
    parts: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, Value):
            parts.append(("V", leaf.device, leaf.parties))
            continue
        try:
            hash(leaf)
            parts.append(("L", type(leaf), leaf))
        except TypeError:
            parts.append(("U", id(leaf)))  # unhashable host values (arrays) retrace
    return (treedef, tuple(parts), id(cluster))


class Function:
    """A function traced into one graph per argument structure; call it in a context."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = str(getattr(fn, "__qualname__", "function"))
        self._programs: LRU[Any, Program] = LRU(_TRACES)
        # the trace of a call without arguments and the cluster it is for: such a call's
        # key is its cluster alone, so it is found without building one
        self._bare: tuple[ClusterSpec, Program] | None = None
        self.traces = 0  # how many times the function was traced (cache misses)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if TRACING[0] and TRACES.recorders:  # inside another trace (active()): inline it
            return self.fn(*args, **kwargs)
        # current(), its common cases read here (ENTERED: any thread's with ctx:; else the
        # default context, read from its module: a Python call less)
        contexts = STACK.contexts if ENTERED[0] else None
        ctx = contexts[-1] if contexts else (_context._default or current())
        bare = self._bare
        if bare is not None and not args and not kwargs and bare[0] is ctx.cluster:
            return bare[1].run(ctx, args, kwargs, [])
        leaves, treedef = flatten_call(args, kwargs)
        program = self._compile(ctx.cluster, args, kwargs, leaves, treedef)
        return program.run(ctx, args, kwargs, leaves)

    def compile(self, cluster: ClusterSpec, *args: Any, **kwargs: Any) -> Program:
        leaves, treedef = flatten_call(args, kwargs)
        return self._compile(cluster, args, kwargs, leaves, treedef)

    def submit(self, ctx: Context, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        """Trace (or find the cached trace) and start it in ``ctx``: ``mp.submit``'s work."""
        bare = self._bare
        if bare is not None and not args and not kwargs and bare[0] is ctx.cluster:
            return bare[1].submit(ctx, args, kwargs, [])
        leaves, treedef = flatten_call(args, kwargs)
        program = self._compile(ctx.cluster, args, kwargs, leaves, treedef)
        return program.submit(ctx, args, kwargs, leaves)

    def _compile(
        self,
        cluster: ClusterSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        leaves: list[Any],
        treedef: Any,
    ) -> Program:
        key = _key(leaves, treedef, cluster)
        program = self._programs.touch(key)
        if program is None:
            program = _trace(self.fn, cluster, args, kwargs, self.name)
            self.traces += 1
            self._programs[key] = program
        if treedef is NO_ARGS:  # a call without arguments (see flatten_call)
            self._bare = (cluster, program)
        return program


def function(fn: Callable[..., Any]) -> Function:
    """Decorator: calls trace ``fn`` into one graph and run it as one job."""
    return fn if isinstance(fn, Function) else Function(fn)


def compile(
    fn: Callable[..., Any], *args: Any, cluster: ClusterSpec | None = None, **kwargs: Any
) -> Program:
    """Trace ``fn`` for these arguments; ``str(program)`` prints its IR, calling runs it."""
    target = cluster or current().cluster
    func = fn if isinstance(fn, Function) else Function(fn)
    return func.compile(target, *args, **kwargs)
