"""Eager device calls on a cache hit: a lookup and one send, no recording.

The first eager call of a function on a PPU, for a given argument structure and placement,
is recorded and checked as a one-op graph (with the moves its arguments need). Its
:class:`Plan` remembers which argument leaf binds each graph input. A later call with the
same function, structure and placements finds the plan by that key and only binds the new
leaves: no recorder, no graph building, no checks. Host values are job inputs, so the graph
never depends on their data; the key therefore holds only each Value's device and ranks,
which leaves are the same Value (a Value passed twice is one input), and whether the
driver holds the Value's data (a small result sent back with its job): such a Value going
to another party is bound from the driver's copy (``Recorder.copy``), so the call is one
job on the callee alone, with no move between workers.

A plan runs its jobs through a call site compiled for its context
(:mod:`mpl.driver.job_site`). ``stats`` counts recordings and replays, so tests can prove
the cache by counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpl.driver.context import Context
from mpl.driver.job_site import JobSite
from mpl.driver.recorder import Out, Recorder, wrap
from mpl.driver.values import NOT_CACHED, Value
from mpl.wire.cluster import ClusterSpec
from mpl.wire.graph import Graph
from mpl.wire.jobs import Lit
from mpl.wire.lru import LRU

__all__ = ["Plan", "lookup", "plan_key", "record", "stats"]

_PLANS = 512

stats = {"recorded": 0, "replayed": 0}  # plans recorded (graph built and checked) / reused


class Plan:
    """A recorded eager call: its graph, and which argument leaf binds each input."""

    __slots__ = ("_site", "cluster", "graph", "inline", "outs", "placements", "sources")

    def __init__(
        self,
        cluster: ClusterSpec,
        graph: Graph,
        sources: Sequence[tuple[str, int, tuple[int, ...]]],
        outs: Sequence[Out],
        placements: Sequence[tuple[int, ...]],
    ) -> None:
        self.cluster = cluster  # held, so the id in the key is never reused while we live
        self.graph = graph
        self.sources = tuple(sources)  # per input: (kind, leaf index, ranks)
        self.outs = list(outs)
        self.placements = list(placements)
        self.inline = tuple(range(len(outs)))
        self._site: JobSite | None = None  # its synchronous jobs, compiled for one context

    def run(self, ctx: Context, leaves: Sequence[Any]) -> list[Value]:
        """Bind ``leaves`` and run the graph as one job."""
        n = len(self.sources)
        bindings: dict[int, list[Any]] = {}
        for i, (kind, leaf, ranks) in enumerate(self.sources):
            x = leaves[leaf]
            if kind == "uri":
                binding = x._uri
            elif kind == "copy":  # the driver's own copy of a small value (Recorder.copy)
                binding = Lit(x.cached(x.parties[0]))
            else:
                binding = Lit(x)
            for r in ranks:
                row = bindings.get(r)
                if row is None:
                    row = bindings[r] = [None] * n
                row[i] = binding
        site = self._site
        if site is None or site.ctx is not ctx:
            site = self._site = JobSite(ctx, self.graph, self.inline)
        job, values, metas = site.run(bindings)
        return wrap(ctx, job, self.outs, self.placements, values, metas)


_plans: LRU[Any, Plan] = LRU(_PLANS)


def plan_key(
    ctx: Context, target: str, nout: int | None, fn: Any, treedef: Any, leaves: Sequence[Any]
) -> Any:
    """The cache key of an eager call, or None when it must be recorded every time.

    None for a Value of another context or of a trace (recording raises the right error),
    and for a function that cannot be a dict key.
    """
    parts: list[Any] = []
    first: dict[int, int] = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, Value):
            if leaf._recorder is not None or leaf._ctx is not ctx:
                return None
            held = len(leaf.parties) == 1 and leaf.cached(leaf.parties[0]) is not NOT_CACHED
            parts.append((leaf.device, leaf.parties, first.setdefault(id(leaf), i), held))
        else:
            parts.append(None)
    key = (target, nout, fn, treedef, tuple(parts), id(ctx.cluster))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def lookup(key: Any, cluster: ClusterSpec) -> Plan | None:
    plan = _plans.touch(key)
    if plan is None or plan.cluster is not cluster:
        return None
    stats["replayed"] += 1
    return plan


def record(
    key: Any,
    ctx: Context,
    name: str,
    build: Callable[[Recorder, Callable[[int], None]], Sequence[Out]],
) -> Plan | None:
    """Record the call once with ``build`` and keep its plan under ``key``.

    ``build(rec, leaf_done)`` records the ops and calls ``leaf_done(i)`` after handling
    argument leaf ``i``, so each input the recorder bound is tied to its leaf. None if some
    input is not one leaf's value (e.g. per-rank shares): such calls are not cached.
    """
    rec = Recorder(ctx.cluster, traced=False, ctx=ctx, name=name)
    leaf_of: list[int] = []

    def leaf_done(i: int) -> None:
        leaf_of.extend([i] * (len(rec.sources) - len(leaf_of)))

    outs = build(rec, leaf_done)
    if len(leaf_of) != len(rec.sources) or any(
        kind not in ("uri", "lit", "copy") for kind, _, _ in rec.sources
    ):
        return None
    graph = rec.builder.build([s for s, _ in outs])
    sources = [
        (kind, leaf, ranks) for (kind, _, ranks), leaf in zip(rec.sources, leaf_of, strict=True)
    ]
    plan = Plan(ctx.cluster, graph, sources, outs, [rec.placement(s) for s, _ in outs])
    stats["recorded"] += 1
    _plans[key] = plan
    return plan
