"""Runs one rank's part of a graph: the ops this rank takes part in, in order.

Kernels live in :data:`KERNELS`, one per opcode, and see the world through a
:class:`JobContext` (the store, peer moves, the deadline). A kernel gets the op's inputs as
this rank holds them (:data:`ABSENT` where it does not) and returns one value per output,
:data:`ABSENT` for outputs this rank will not hold. Values are dropped after their last
use, so a large intermediate does not outlive the op that consumes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, Protocol

from mpl.wire.errors import JobAbortedError
from mpl.wire.graph import Graph, Op, fill
from mpl.wire.kernels import KernelRef
from mpl.worker.store import ABSENT  # the store keeps outputs with it in place

if TYPE_CHECKING:
    from mpl.wire.sessions import SymbolInfo
    from mpl.worker.store import ObjectStore

__all__ = [
    "ABSENT", "KERNELS", "MAX_SPANS", "JobContext", "OpFailed", "Plan", "op_label", "run_graph",
]  # fmt: skip


class JobContext(Protocol):
    """What a running job may do besides computing."""

    session: str
    job: str
    rank: int
    deadline: float
    spans: list[list[Any]]  # [op index, label, start s, end s] relative to ``started``
    started: float  # time.monotonic() when the job started
    store: ObjectStore  # this worker's values: ``save`` and ``load`` ops use it
    saved: list[SymbolInfo]  # names this rank's ``save`` ops wrote, listed in its Done
    sealer: str  # the driver that sealed this job here ("" in plaintext): a save's owner

    def send(self, dst: int, op: int, seq: int, value: Any) -> None: ...

    def recv(self, src: int, op: int, seq: int) -> Any: ...

    def extension(self, name: str) -> Any:
        """A per-worker service a kernel needs (e.g. "spu"), created on first use."""
        ...

    # Where the job is, set by the interpreter as each op starts: (ops of this rank done,
    # of how many, the graph, the op's index). An attribute, not a call: most ops report
    # nothing, and a call per op costs more than the op of a quick job.
    position: tuple[int, int, Graph, int] | None
    next_report: float  # time.monotonic() from which report() has something to do

    def report(self, now: float) -> None:
        """Report ``position`` (progress); the interpreter calls it once ``next_report``
        has come, at an op's start."""
        ...


Kernel = Callable[[JobContext, Graph, int, Op, list[Any]], list[Any]]
KERNELS: dict[str, Kernel] = {}
MAX_SPANS = 2000  # per job and rank, for mp.trace


def kernel(opcode: str) -> Callable[[Kernel], Kernel]:
    def register(fn: Kernel) -> Kernel:
        KERNELS[opcode] = fn
        return fn

    return register


class OpFailed(Exception):
    """An op raised; carries which op, for the error sent back to the driver."""

    def __init__(self, label: str, cause: BaseException) -> None:
        super().__init__(f"{label}: {cause}")
        self.label = label
        self.cause = cause


def op_label(graph: Graph, index: int) -> str:
    op = graph.ops[index]
    if type(op.attrs.get("symbol")) is str:  # save / load: the name is what says which
        return f"{index} ({op.opcode} {op.attrs['symbol']!r})"
    fn = op.attrs.get("fn")
    name = op.attrs.get("name") or ""
    if not name and type(fn) is int and 0 <= fn < len(graph.fns):
        name = getattr(graph.fns[fn], "__qualname__", "") or getattr(graph.fns[fn], "__name__", "")
    return f"{index} ({op.opcode} {name})" if name else f"{index} ({op.opcode})"


@dataclass(frozen=True)
class Plan:
    """What one rank needs to know to run a graph, computed once per program."""

    graph: Graph
    rank: int
    free_after: tuple[tuple[int, ...], ...]  # values to drop once op k has run
    ops_here: int = 0  # ops this rank takes part in (progress reports count them)
    labels: tuple[str, ...] = ()  # op_label of each op, for spans and errors
    # per op, what run_graph needs of it, worked out once: (index, op, whether this rank
    # takes part, its first output's value id, values to drop after it, its label)
    steps: tuple[tuple[int, Op, bool, int, tuple[int, ...], str], ...] = ()

    @classmethod
    def build(cls, graph: Graph, rank: int) -> Plan:
        keep = set(graph.outputs)
        last: dict[int, int] = {}
        for k, op in enumerate(graph.ops):
            for v in op.inputs:
                last[v] = k
        free: list[list[int]] = [[] for _ in graph.ops]
        for v, k in last.items():
            if v not in keep:
                free[k].append(v)
        here = sum(1 for op in graph.ops if rank in op.ranks)
        labels = tuple(op_label(graph, k) for k in range(len(graph.ops)))
        free_after = tuple(tuple(f) for f in free)
        steps = []
        vid = len(graph.inputs)
        for k, op in enumerate(graph.ops):
            steps.append((k, op, rank in op.ranks, vid, free_after[k], labels[k]))
            vid += op.nout
        return cls(graph, rank, free_after, here, labels, tuple(steps))


def run_graph(plan: Plan, inputs: Sequence[Any], ctx: JobContext) -> list[Any]:
    """Run ``plan``'s graph on its rank; return the graph outputs (ABSENT where not held).
    ``plan`` comes from :meth:`Plan.build` (its steps say what each op needs)."""
    graph = plan.graph
    # comprehensions are calls of their own: skipped where there is nothing to go through,
    # and map over a dict's get (no Python frame) where values are looked up
    env: dict[int, Any] = {i: v for i, v in enumerate(inputs) if v is not ABSENT} if inputs else {}
    origin, spans = ctx.started, ctx.spans
    done = 0
    for k, op, here, vid, frees, label in plan.steps:
        if here:
            ctx.position = (done, plan.ops_here, graph, k)
            start = time.monotonic()  # the op's start, and the progress report's clock
            if start >= ctx.next_report:  # short jobs report nothing
                ctx.report(start)
            done += 1
            args = list(map(env.get, op.inputs, repeat(ABSENT))) if op.inputs else []
            try:
                outs = KERNELS[op.opcode](ctx, graph, k, op, args)
            except (JobAbortedError, OpFailed):
                raise
            except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt too
                raise OpFailed(label, exc) from exc
            if len(spans) < MAX_SPANS:
                spans.append([k, label, start - origin, time.monotonic() - origin])
            for i, value in enumerate(outs):
                if value is not ABSENT:
                    env[vid + i] = value
        for v in frees:
            env.pop(v, None)
    return list(map(env.get, graph.outputs, repeat(ABSENT)))


# -- kernels -------------------------------------------------------------------------------


@kernel("pcall")
def _pcall(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    fn = graph.fns[op.attrs["fn"]]
    if isinstance(fn, KernelRef):  # mp.kernel(name): this node's installed implementation
        fn = ctx.extension("kernels").resolve(fn.name, ctx.session, ctx.sealer)
    attrs = op.attrs
    if "args" in attrs or "kwargs" in attrs:
        template, named = attrs.get("args", ()), attrs.get("kwargs", {})
        # an empty template fills to itself: most calls take no arguments
        result = fn(*(fill(template, args) if template else template),
                    **(fill(named, args) if named else named))  # fmt: skip
    else:
        result = fn(*args)
    return [result] if op.nout == 1 else split_outputs(result, op.nout)  # one output: most


def split_outputs(result: Any, nout: int) -> list[Any]:
    if nout == 1:
        return [result]
    if nout == 0:
        return []
    if not isinstance(result, (tuple, list)) or len(result) != nout:
        got = (
            f"{type(result).__name__} of length {len(result)}"
            if isinstance(result, (tuple, list))
            else type(result).__name__
        )
        raise TypeError(
            f"the function must return a tuple of {nout} values (nout={nout}), got {got}"
        )
    return list(result)


@kernel("constant")
def _constant(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    return [op.attrs["value"]]


@kernel("getitem")
def _getitem(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    return [args[0][op.attrs["key"]]]


@kernel("converge")
def _converge(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    held = [a for a in args if a is not ABSENT]
    return [held[0]]  # the checker guarantees exactly one input is held here


@kernel("shuffle")
def _shuffle(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    routing: dict[int, int] = op.attrs["routing"]
    me, value = ctx.rank, args[0]
    for dst, src in routing.items():  # send first, so swaps do not deadlock
        if src == me and dst != me:
            ctx.send(dst, k, 0, value)
    source = routing.get(me)
    if source is None:
        return [ABSENT]
    if source == me:
        return [value]
    return [ctx.recv(source, k, 0)]


# The save and load ops live in their own module, which needs the names above: registered
# here, so that wherever graphs run, they can.
from mpl.worker import name_ops  # noqa: E402, F401
