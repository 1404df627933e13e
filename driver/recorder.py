"""Recording ops into a graph: for one eager call, or for a whole ``@mp.function`` trace.

Every API that computes (device calls, ``put``, ``simp``, collectives) describes its ops to
a :class:`Recorder` through :func:`emit`. Outside a trace, ``emit`` records into a fresh
recorder and runs the graph at once as one job; inside a trace, the ops join the traced
graph and the results are traced Values.

Host values become job inputs bound on the ranks that need them, in a trace as in an eager
call, never constants of the graph: every rank of a job receives the whole graph, but only
its own bindings (so a share or a party's private value reaches that party alone). An eager
call's graph does not depend on the data it is given, and is cached and sent once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from mpl.driver.context import Context, current
from mpl.driver.tree import unflatten
from mpl.driver.values import Value, output_value
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import MplError
from mpl.wire.graph import Arg, Graph, GraphBuilder
from mpl.wire.jobs import Lit, output_uri
from mpl.wire.lru import LRU

__all__ = ["TRACES", "TRACING", "Recorder", "active", "emit"]

Ranks = tuple[int, ...]
Out = tuple[int, str | None]  # (symbol, device) of one result
_GRAPH_CACHE = 512


class _Active(threading.local):
    def __init__(self) -> None:
        self.recorders: list[Recorder] = []


_active = _Active()
# the same, for a hot path that reads ``TRACES.recorders`` itself instead of calling active()
TRACES = _active
# recorders active over all threads (changed under _counting): while none is, no thread
# traces, and a hot path reads TRACING[0] first (a thread-local's attribute costs ~500
# instructions); a thread that traces counts itself before it pushes, so it sees its own
TRACING = [0]
_counting = threading.Lock()


def _recount_in_child() -> None:
    """A forked child runs this thread alone: a lock another thread held at the fork would
    never be released there (its first trace would block for ever), and only this thread's
    recorders are the child's."""
    global _counting
    _counting = threading.Lock()
    TRACING[0] = len(_active.recorders)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_recount_in_child)


def active() -> Recorder | None:
    """The recorder of the trace being built in this thread, if any."""
    if not TRACING[0]:
        return None
    return _active.recorders[-1] if _active.recorders else None


def cluster_now() -> ClusterSpec:
    rec = active()
    return rec.cluster if rec is not None else current().cluster


class Recorder:
    """A graph under construction, with the bindings of its inputs."""

    def __init__(
        self, cluster: ClusterSpec, *, traced: bool, ctx: Context | None = None, name: str = ""
    ) -> None:
        self.cluster = cluster
        self.traced = traced
        self.ctx = ctx
        self.builder = GraphBuilder(cluster.world_size, name)
        self.sources: list[
            tuple[str, Any, Ranks]
        ] = []  # per input: ("uri"|"lit"|"copy"|"each"|"param", x, ranks)
        self._inputs: dict[int, int] = {}  # id(Value) -> symbol
        self._held: list[Value] = []  # keeps bound Values alive until the job has run
        self.key: list[Any] = []  # structure of the eager graph, for the cache
        # names saved by this trace so far: a later mp.load of one reads it without asking
        # the broker (it does not exist before the job runs): name -> (ranks, device)
        self.saved_here: dict[str, tuple[Ranks, str | None]] = {}
        self._session_saves: dict[str, Ranks] = {}  # session names saved: one value each

    # -- inputs ---------------------------------------------------------------------------
    def of(self, value: Value) -> int:
        """The symbol standing for ``value`` in this graph (binding it as an input if needed)."""
        if value._recorder is self:
            return value._sym
        if value._recorder is not None:
            raise MplError(
                "a traced value escaped its @mp.function trace; return it from the function "
                "instead of storing it outside"
            )
        if self.ctx is not None and value._ctx is not self.ctx:
            raise MplError(f"{value!r} belongs to another context than the one running this call")
        sym = self._inputs.get(id(value))
        if sym is None:
            sym = self.builder.input(value.parties)
            self._inputs[id(value)] = sym
            self.sources.append(("uri", value._uri, value.parties))
            self._held.append(value)
            self.key.append(("in", value.parties))
        return sym

    def param(self, ranks: Ranks) -> int:
        """A traced program's parameter: bound to a Value when the program runs."""
        sym = self.builder.input(ranks)
        self.sources.append(("param", None, ranks))
        return sym

    def host(self, value: Any, ranks: Sequence[int]) -> int:
        """A host value made available on ``ranks``: a job input bound on those ranks only."""
        ranks = tuple(sorted(set(ranks)))
        sym = self.builder.input(ranks)
        self.sources.append(("lit", value, ranks))
        self.key.append(("lit", ranks))
        return sym

    def copy(self, value: Value, rank: int) -> int:
        """``value`` made available on ``rank`` from the driver's own copy of it (the small
        result its job sent back, see :meth:`Value.cached`): a job input bound on ``rank``
        only, so no move between workers is needed. Eager calls only: a traced program's
        graph must not depend on what the driver happens to hold."""
        sym = self.builder.input((rank,))
        self.sources.append(("copy", value, (rank,)))
        self.key.append(("copy", rank))
        return sym

    def host_each(self, values: dict[int, Any]) -> int:
        """A value made of a different host value on each rank (e.g. one share per member):
        each rank is bound its own part only."""
        ranks = tuple(sorted(values))
        sym = self.builder.input(ranks)
        self.sources.append(("each", dict(values), ranks))
        self.key.append(("each", ranks))
        return sym

    # -- ops ------------------------------------------------------------------------------
    def fn(self, f: Any) -> int:
        return self.builder.fn(f)

    def op(
        self,
        opcode: str,
        inputs: Sequence[int],
        *,
        ranks: Sequence[int],
        nout: int = 1,
        **attrs: Any,
    ) -> list[int]:
        outs = self.builder.op(opcode, inputs, ranks=ranks, nout=nout, **attrs)
        fn = attrs.get("fn")
        frozen = {k: v for k, v in attrs.items() if k != "fn"}
        self.key.append(
            (
                opcode,
                tuple(inputs),
                tuple(ranks),
                nout,
                id(self.builder._fns[fn]) if type(fn) is int else None,
                _freeze(frozen),
            )
        )
        return outs

    def save(self, sym: int, name: str, persist: bool, device: str | None) -> None:
        """``mp.save`` in a trace: a ``save`` op run by every rank holding ``sym``."""
        ranks = self.placement(sym)
        before = self._session_saves.setdefault(name, ranks) if not persist else ranks
        if before != ranks:
            # the workers name what they hold, in no order the broker could see: one
            # session name must come from one value
            raise MplError(
                f"{name!r} is saved twice in this function, on ranks {list(before)} and "
                f"{list(ranks)}: a session name holds one value, use two names"
            )
        self.op(
            "save", [sym], ranks=ranks, nout=0, symbol=name, persist=persist, device=device or ""
        )
        self.saved_here[name] = (ranks, device)

    def load(self, name: str, ranks: Ranks, device: str | None) -> int:
        """``mp.load`` in a trace: a ``load`` op on ``ranks``, each reading its own value
        (the session's, else its persisted file) when the job runs."""
        return self.op("load", [], ranks=ranks, symbol=name, device=device or "")[0]

    def placement(self, sym: int) -> Ranks:
        return self.builder.placements[sym]

    def traced_value(self, sym: int, device: str | None) -> Value:
        return Value(device, self.placement(sym), recorder=self, sym=sym)

    # -- running (eager) ------------------------------------------------------------------
    def run(self, ctx: Context, outs: Sequence[Out]) -> list[Value]:
        graph = self._cached_graph([s for s, _ in outs])
        bindings = bind(self.sources, graph.world_size, [None] * len(self.sources))
        result = ctx.run(graph, bindings, inline=tuple(range(len(outs))))
        self._held.clear()
        placements = [self.placement(s) for s, _ in outs]
        return wrap(ctx, result.job, outs, placements, result.values, result.metas)

    def _cached_graph(self, outputs: list[int]) -> Graph:
        key = (tuple(self.key), tuple(outputs), id(self.cluster))
        graph = _EAGER.touch(key)
        if graph is None:
            graph = self.builder.build(outputs)
            _EAGER[key] = graph
        return graph


# Eager graphs by structure. Keys hold function ids, so the graphs (which hold the functions)
# keep them alive and an id is never reused while its entry exists.
_EAGER: LRU[Any, Graph] = LRU(_GRAPH_CACHE)


def _freeze(x: Any) -> Any:
    t = type(x)
    if t is dict:
        return ("d", tuple((k, _freeze(v)) for k, v in x.items()))
    if t in (list, tuple):
        return (t.__name__, tuple(_freeze(v) for v in x))
    if t is Arg:
        return ("arg", x.index)
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return x


def bind(
    sources: Sequence[tuple[str, Any, Ranks]], world_size: int, params: Sequence[Value | None]
) -> dict[int, list[Any]]:
    """Per-rank input bindings: each rank gets its inputs' URIs or literals, None elsewhere."""
    bindings: dict[int, list[Any]] = {}
    n = len(sources)
    for i, (kind, x, ranks) in enumerate(sources):
        if kind == "param":
            value = params[i]
            assert value is not None
            binding: Any = value._uri
        elif kind == "uri":
            binding = x
        elif kind == "copy":
            binding = Lit(x.cached(x.parties[0]))
        elif kind == "each":
            for r in ranks:
                bindings.setdefault(r, [None] * n)[i] = Lit(x[r])
            continue
        else:
            binding = Lit(x)
        for r in ranks:
            bindings.setdefault(r, [None] * n)[i] = binding
    return bindings


assert output_uri("job", 7) == "job/7"  # wrap writes it out


def wrap(
    ctx: Context,
    job: str,
    outs: Sequence[Out],
    placements: Sequence[Ranks],
    got: dict[int, dict[int, Any]],
    metas: dict[int, str],
) -> list[Value]:
    """Values for a finished job's outputs, with the small ones already cached (``got`` and
    ``metas``: the job's JobResult's ``values`` and ``metas``)."""
    if len(outs) != len(placements):
        raise ValueError(f"{len(outs)} outputs, {len(placements)} placements")
    values = []
    for i, (_, device) in enumerate(outs):  # plain indexing: this runs for every job
        # output_uri(job, i) written out, as checked on import
        values.append(
            output_value(device, placements[i], ctx, f"{job}/{i}", got.get(i), metas.get(i, ""))
        )
    return values


def call_template(
    leaves: list[Any],
    treedef: Any,
    value: Callable[[Value], int],
    host: Callable[[Any], int | None],
) -> tuple[list[int], Any, Any]:
    """The op inputs and (args, kwargs) templates of a function call on flattened arguments.

    Each Value leaf becomes an input through ``value`` (which may move it first); each host
    leaf becomes an input through ``host``, or stays in the template where ``host`` returns
    None (a constant of the traced program).
    """
    inputs: list[int] = []
    template: list[Any] = []
    for leaf in leaves:
        sym = value(leaf) if isinstance(leaf, Value) else host(leaf)
        if sym is None:
            template.append(leaf)
            continue
        inputs.append(sym)
        template.append(Arg(len(inputs) - 1))
    targs, tkwargs = unflatten(treedef, template)
    return inputs, targs, tkwargs


def emit(build: Callable[[Recorder], Sequence[Out]], name: str = "") -> list[Value]:
    """Record ops with ``build``; in a trace return traced Values, else run them now."""
    rec = active()
    if rec is not None:
        return [rec.traced_value(sym, dev) for sym, dev in build(rec)]
    ctx = current()
    ctx._check_open()
    rec = Recorder(ctx.cluster, traced=False, ctx=ctx, name=name)
    outs = build(rec)
    return rec.run(ctx, outs)


class tracing:
    """Make ``rec`` the active recorder of this thread for a block."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def __enter__(self) -> Recorder:
        with _counting:
            TRACING[0] += 1
        _active.recorders.append(self.rec)
        return self.rec

    def __exit__(self, *exc: object) -> None:
        _active.recorders.pop()
        with _counting:
            TRACING[0] -= 1
