"""Graph IR: the unit a driver sends to workers.

A graph is an SSA list of ops over numbered values. Graph inputs are ``%0 .. %k-1``; each
op's outputs take the next numbers. Every value has a *placement*: the ranks that hold it.
Every op has an opcode from the closed list :data:`OPCODES`, its input values, a number of
outputs, attributes, and the ranks that run it.

================  =========================================================================
opcode            meaning (placement rule)
================  =========================================================================
``pcall``         call ``fns[attrs["fn"]]`` on each of ``ranks`` with its local inputs;
                  inputs must be held by every rank of the op; outputs held by ``ranks``
``shuffle``       move the input by ``attrs["routing"] = {dst: src}`` (receiver-oriented);
                  sources must hold the input; the output is held by the destinations
``converge``      join values held by disjoint rank sets into one held by their union
``constant``      ``attrs["value"]`` on ``ranks``
``getitem``       ``input[attrs["key"]]`` where the input lives
``spu.seal``      secret-share a value held by one rank onto SPU ``attrs["device"]``
``spu.run``       run ``fns[attrs["fn"]]`` under MPC on the SPU members
``spu.reveal``    rebuild an SPU value in plaintext on rank ``attrs["to"]``
``save``          name the input ``attrs["symbol"]`` on every rank holding it: in the
                  session, or (``attrs["persist"]``) on that rank's own disk; no outputs
``load``          the value named ``attrs["symbol"]`` as each of ``ranks`` holds it (the
                  session's own first, else the rank's persisted one); held by ``ranks``
================  =========================================================================

A ``save`` or ``load`` carries the name as written: the workers check it (with the one
name rule of ``mpl.wire.limits``) when they run the op, so a bad name fails the job at that
op, naming it, exactly as a bad name fails a save outside a program.

Callables are kept once per graph in ``fns`` and referenced by index, so each one is pickled
once. :func:`check` is the checker, :func:`format_graph` the printer and ``Graph.digest`` the
content hash that workers cache graphs by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from mpl.wire.errors import GraphError
from mpl.wire.record import Record

__all__ = [
    "OPCODES",
    "Arg",
    "Graph",
    "GraphBuilder",
    "Op",
    "check",
    "fill",
    "format_graph",
]

Ranks = tuple[int, ...]


@dataclass(eq=False, repr=False)
class Arg(Record, tag="arg"):
    """Placeholder for op input ``index`` inside a pcall's argument template."""

    index: int


@dataclass(eq=False, repr=False)
class Op(Record, tag="op"):
    opcode: str
    inputs: tuple[int, ...]
    nout: int
    ranks: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class Graph(Record, tag="graph"):
    world_size: int
    inputs: tuple[tuple[int, ...], ...]  # placement of each graph input
    ops: tuple[Op, ...]
    outputs: tuple[int, ...]
    fns: tuple[Any, ...] = ()
    name: str = ""

    WIRE_DIGEST: ClassVar[bool] = True  # decode fills in ``digest`` from the received bytes

    @cached_property
    def digest(self) -> str:
        """sha256 of the encoded graph: equal graphs from one driver share it.

        A decoded graph's digest is that of the bytes it arrived in (the codec computes it),
        so a receiver checks a ``Program``'s claimed digest against it.
        """
        from mpl.wire.codec import encode, frames_digest  # codec imports records: no cycle

        return frames_digest(encode(self)[1:])

    @cached_property
    def wire_nbytes(self) -> int:
        """Bytes of the encoded graph (header and buffer frames): what a program cache
        counts it as. A decoded graph's is that of the bytes it arrived in, so every holder
        of one program counts the same size."""
        from mpl.wire.codec import encode  # codec imports records: no cycle

        return sum(memoryview(f).nbytes for f in encode(self)[1:])

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """Every rank that runs an op of this graph."""
        return tuple(sorted({r for op in self.ops for r in op.ranks}))

    @cached_property
    def opcodes(self) -> frozenset[str]:
        return frozenset(op.opcode for op in self.ops)

    @cached_property
    def placements(self) -> list[Ranks]:
        """The placement of every value, as the checker computed it."""
        return check(self)

    def __str__(self) -> str:
        return format_graph(self)


# -- placement rules: one per opcode -------------------------------------------------------

_Rule = Callable[[Op, list[Ranks], "Graph | None"], list[Ranks]]


def _arity(op: Op, n_in: int | None, n_out: int | None) -> None:
    if n_in is not None and len(op.inputs) != n_in:
        raise GraphError(f"{op.opcode} takes {n_in} input(s), got {len(op.inputs)}")
    if n_out is not None and op.nout != n_out:
        raise GraphError(f"{op.opcode} has {n_out} output(s), got nout={op.nout}")


def _same_ranks(op: Op, expected: Sequence[int]) -> None:
    if tuple(op.ranks) != tuple(sorted(set(expected))):
        raise GraphError(
            f"{op.opcode} must run on ranks {_fmt_ranks(sorted(set(expected)))}, "
            f"got {_fmt_ranks(op.ranks)}"
        )


def _covered(op: Op, ins: list[Ranks]) -> None:
    for i, placed in enumerate(ins):
        missing = set(op.ranks) - set(placed)
        if missing:
            raise GraphError(
                f"{op.opcode} runs on {_fmt_ranks(op.ranks)} but input {i} "
                f"(%{op.inputs[i]}) is held only by {_fmt_ranks(placed)}: "
                f"not covered on {_fmt_ranks(sorted(missing))}"
            )


def _fn_index(op: Op, graph: Graph | None) -> None:
    fn = op.attrs.get("fn")
    if type(fn) is not int or (graph is not None and not 0 <= fn < len(graph.fns)):
        raise GraphError(f"{op.opcode} attribute 'fn' must index the graph's functions")


def _rule_pcall(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, None, None)
    if op.nout < 0:
        raise GraphError("pcall needs nout >= 0")
    _fn_index(op, graph)
    _covered(op, ins)
    return [op.ranks] * op.nout


def _rule_constant(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 0, 1)
    if "value" not in op.attrs:
        raise GraphError("constant needs attribute 'value'")
    return [op.ranks]


def _rule_shuffle(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 1, 1)
    routing = op.attrs.get("routing")
    if not isinstance(routing, dict) or not routing:
        raise GraphError("shuffle needs a non-empty attribute 'routing' {dst: src}")
    if not all(type(k) is int and type(v) is int for k, v in routing.items()):
        raise GraphError("shuffle routing must map int ranks to int ranks")
    absent = sorted({s for s in routing.values() if s not in ins[0]})
    if absent:
        raise GraphError(
            f"shuffle source rank(s) {_fmt_ranks(absent)} do not hold the input "
            f"(held by {_fmt_ranks(ins[0])})"
        )
    _same_ranks(op, [*routing, *routing.values()])
    return [tuple(sorted(routing))]


def _rule_converge(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, None, 1)
    if not ins:
        raise GraphError("converge needs at least one input")
    seen: set[int] = set()
    for placed in ins:
        overlap = seen & set(placed)
        if overlap:
            raise GraphError(
                f"converge inputs must be held by disjoint ranks; "
                f"{_fmt_ranks(sorted(overlap))} hold more than one"
            )
        seen |= set(placed)
    _same_ranks(op, sorted(seen))
    return [tuple(sorted(seen))]


def _rule_getitem(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 1, 1)
    if "key" not in op.attrs:
        raise GraphError("getitem needs attribute 'key'")
    _same_ranks(op, ins[0])
    return [ins[0]]


def _spu_members(op: Op) -> Ranks:
    members = op.attrs.get("members")
    if (
        not isinstance(members, tuple)
        or len(members) < 2
        or not all(type(m) is int for m in members)
    ):
        raise GraphError(f"{op.opcode} needs attribute 'members': a tuple of 2+ ranks")
    if not isinstance(op.attrs.get("device"), str):
        raise GraphError(f"{op.opcode} needs attribute 'device'")
    return members


def _rule_spu_seal(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 1, 1)
    members = _spu_members(op)
    if len(ins[0]) != 1:
        raise GraphError(f"spu.seal takes a value held by one rank, got {_fmt_ranks(ins[0])}")
    _same_ranks(op, [*members, *ins[0]])
    return [tuple(sorted(members))]


def _rule_spu_run(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    members = tuple(sorted(_spu_members(op)))
    _fn_index(op, graph)
    _same_ranks(op, members)
    for i, placed in enumerate(ins):
        if tuple(placed) != members:
            raise GraphError(
                f"spu.run input {i} (%{op.inputs[i]}) is held by {_fmt_ranks(placed)}, "
                f"not by the SPU members {_fmt_ranks(members)}: seal it first"
            )
    return [members] * op.nout


def _rule_spu_reveal(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 1, 1)
    members = tuple(sorted(_spu_members(op)))
    to = op.attrs.get("to")
    if type(to) is not int:
        raise GraphError("spu.reveal needs attribute 'to' (a rank)")
    if tuple(ins[0]) != members:
        raise GraphError(f"spu.reveal input is not held by the SPU members {_fmt_ranks(members)}")
    _same_ranks(op, [*members, to])
    return [(to,)]


def _symbol_attrs(op: Op) -> None:
    if type(op.attrs.get("symbol")) is not str:
        raise GraphError(f"{op.opcode} needs attribute 'symbol' (the value's name, a str)")
    if type(op.attrs.get("device", "")) is not str:
        raise GraphError(f"{op.opcode} attribute 'device' must be a str")


def _rule_save(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 1, 0)
    _symbol_attrs(op)
    if type(op.attrs.get("persist")) is not bool:
        raise GraphError("save needs attribute 'persist' (a bool)")
    _same_ranks(op, ins[0])  # every holder names its part, and only holders
    return []


def _rule_load(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 0, 1)
    _symbol_attrs(op)
    return [op.ranks]


def _rule_unsave(op: Op, ins: list[Ranks], graph: Graph | None) -> list[Ranks]:
    _arity(op, 0, 0)  # each rank deletes its own persisted file (a secure mp.delete)
    _symbol_attrs(op)
    return []


_RULES: dict[str, _Rule] = {
    "pcall": _rule_pcall,
    "shuffle": _rule_shuffle,
    "converge": _rule_converge,
    "constant": _rule_constant,
    "getitem": _rule_getitem,
    "spu.seal": _rule_spu_seal,
    "spu.run": _rule_spu_run,
    "spu.reveal": _rule_spu_reveal,
    "save": _rule_save,
    "load": _rule_load,
    "unsave": _rule_unsave,
}
OPCODES: tuple[str, ...] = tuple(_RULES)


def _check_ranks(ranks: Any, world_size: int, what: str) -> Ranks:
    if not isinstance(ranks, tuple) or not ranks:
        raise GraphError(f"{what}: ranks must be a non-empty tuple")
    if not all(type(r) is int for r in ranks) or list(ranks) != sorted(set(ranks)):
        raise GraphError(f"{what}: ranks must be sorted, unique ints, got {ranks!r}")
    if ranks[0] < 0 or ranks[-1] >= world_size:
        raise GraphError(
            f"{what}: rank out of range in {_fmt_ranks(ranks)} (world size {world_size})"
        )
    return ranks


def _check_op(op: Op, placements: list[Ranks], graph: Graph | None, index: int) -> list[Ranks]:
    where = f"op {index} ({op.opcode})"
    rule = _RULES.get(op.opcode)
    if rule is None:
        raise GraphError(f"{where}: unknown opcode {op.opcode!r}; known: {', '.join(OPCODES)}")
    world = graph.world_size if graph is not None else None
    if world is not None:
        _check_ranks(op.ranks, world, where)
    for v in op.inputs:
        if type(v) is not int or not 0 <= v < len(placements):
            raise GraphError(f"{where}: input %{v} is not defined before this op")
    try:
        outs = rule(op, [placements[v] for v in op.inputs], graph)
    except GraphError as exc:
        raise GraphError(f"{where}: {exc}") from None
    if world is not None:
        for o in outs:
            _check_ranks(o, world, where)
    return outs


def check(graph: Graph) -> list[Ranks]:
    """Check ``graph``; return every value's placement. Raises :class:`GraphError`."""
    if type(graph.world_size) is not int or graph.world_size < 1:
        raise GraphError(f"world_size must be a positive int, got {graph.world_size!r}")
    placements = [
        _check_ranks(p, graph.world_size, f"input %{i}") for i, p in enumerate(graph.inputs)
    ]
    for i, op in enumerate(graph.ops):
        placements.extend(_check_op(op, placements, graph, i))
    for v in graph.outputs:
        if type(v) is not int or not 0 <= v < len(placements):
            raise GraphError(f"output %{v} is not defined")
    return placements


# -- templates -----------------------------------------------------------------------------


def fill(template: Any, values: Sequence[Any]) -> Any:
    """Replace every :class:`Arg` in a (nested list/tuple/dict) template by its value."""
    t = type(template)
    if t is Arg:
        return values[template.index]
    if t is tuple:
        return tuple(fill(x, values) for x in template)
    if t is list:
        return [fill(x, values) for x in template]
    if t is dict:
        return {k: fill(v, values) for k, v in template.items()}
    return template


# -- building ------------------------------------------------------------------------------


class GraphBuilder:
    """Builds a graph op by op, checking each op as it is added (errors at trace time).

    Inputs may be declared at any point (a value captured halfway through a trace); the
    builder numbers values provisionally and :meth:`build` renumbers them so that graph
    inputs come first, as the IR requires.
    """

    def __init__(self, world_size: int, name: str = "") -> None:
        self.world_size = world_size
        self.name = name
        self._inputs: list[int] = []  # provisional ids of the inputs, in declaration order
        self._ops: list[Op] = []  # with provisional ids
        self._op_first: list[int] = []  # provisional id of each op's first output
        self._fns: list[Any] = []
        self._fn_ids: dict[int, int] = {}
        self.placements: list[Ranks] = []  # by provisional id

    def input(self, ranks: Sequence[int]) -> int:
        placed = _check_ranks(tuple(ranks), self.world_size, f"input {len(self._inputs)}")
        self.placements.append(placed)
        self._inputs.append(len(self.placements) - 1)
        return len(self.placements) - 1

    def fn(self, f: Any) -> int:
        """Index of ``f`` in the function table (each callable is stored once)."""
        index = self._fn_ids.get(id(f))
        if index is None:
            index = self._fn_ids[id(f)] = len(self._fns)
            self._fns.append(f)
        return index

    def op(
        self,
        opcode: str,
        inputs: Sequence[int],
        *,
        ranks: Sequence[int],
        nout: int = 1,
        **attrs: Any,
    ) -> list[int]:
        """Append an op; return its output value numbers."""
        op = Op(opcode, tuple(inputs), nout, tuple(sorted(set(ranks))), attrs)
        view = Graph(self.world_size, (), (), (), tuple(self._fns))
        outs = _check_op(op, self.placements, view, len(self._ops))
        self._ops.append(op)
        first = len(self.placements)
        self._op_first.append(first)
        self.placements.extend(outs)
        return list(range(first, first + nout))

    def build(self, outputs: Sequence[int]) -> Graph:
        final: dict[int, int] = {v: i for i, v in enumerate(self._inputs)}
        ops = []
        for op, first in zip(self._ops, self._op_first, strict=True):
            ops.append(
                Op(op.opcode, tuple(final[v] for v in op.inputs), op.nout, op.ranks, op.attrs)
            )
            base = len(final)
            for i in range(op.nout):
                final[first + i] = base + i
        graph = Graph(
            self.world_size,
            tuple(self.placements[v] for v in self._inputs),
            tuple(ops),
            tuple(final[v] for v in outputs),
            tuple(self._fns),
            self.name,
        )
        check(graph)
        return graph


# -- printing ------------------------------------------------------------------------------


def _fmt_ranks(ranks: Sequence[int]) -> str:
    return "@" + ",".join(str(r) for r in ranks)


def _fmt_value(value: Any, graph: Graph, key: str) -> str:
    if key == "fn" and type(value) is int and 0 <= value < len(graph.fns):
        fn = graph.fns[value]
        return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn)
    if type(value).__name__ == "ndarray":
        return f"array<{value.dtype}{list(value.shape)}>"
    if type(value) is dict:
        return "{" + ", ".join(f"{k}: {_fmt_value(v, graph, '')}" for k, v in value.items()) + "}"
    if type(value) in (tuple, list):
        items = ", ".join(_fmt_value(v, graph, "") for v in value)
        return f"({items})" if type(value) is tuple else f"[{items}]"
    if isinstance(value, Arg):
        return f"${value.index}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_graph(graph: Graph) -> str:
    """Readable text of ``graph``, one line per op; stable, so tests compare it."""
    placements = check(graph)
    head = ", ".join(f"%{i}: {_fmt_ranks(p)}" for i, p in enumerate(graph.inputs))
    lines = [f"graph {graph.name or '_'}({head}) world={graph.world_size} {{"]
    next_value = len(graph.inputs)
    for op in graph.ops:
        outs = ", ".join(f"%{next_value + i}" for i in range(op.nout)) or "_"
        attrs = ", ".join(
            f"{k}={_fmt_value(v, graph, k)}"
            for k, v in sorted(op.attrs.items())
            if k != "name"  # a label; `fn` already says it
            and not (type(v) in (dict, tuple, list) and not v)  # empty templates are noise
        )
        args = ", ".join(f"%{v}" for v in op.inputs)
        placed = " ".join(_fmt_ranks(placements[next_value + i]) for i in range(op.nout))
        line = f"  {outs} = {op.opcode}"
        line += f"[{attrs}]" if attrs else ""
        line += f"({args}) on {_fmt_ranks(op.ranks)}"
        line += f" -> {placed}" if placed else ""
        lines.append(line)
        next_value += op.nout
    lines.append("  return " + ", ".join(f"%{v}" for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines)
