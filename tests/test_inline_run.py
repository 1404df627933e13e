"""A quick program's compiled run (worker/inline_run.py) against the interpreter's: the same
graphs give the same outputs, the same spans (op and label; times are the run's own) and
the same errors, and a graph with an op it does not compile is left to the interpreter."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mpl.wire.graph import Arg, Graph, GraphBuilder
from mpl.wire.kernels import KernelRef
from mpl.worker.inline_run import InlineRun
from mpl.worker.interpreter import ABSENT, MAX_SPANS, OpFailed, Plan, run_graph

RANK = 1


class _Context:
    """What run_graph needs of a job's context for local ops: spans and no reports."""

    def __init__(self) -> None:
        self.started = 0.0
        self.spans: list[list[Any]] = []
        self.position: Any = None
        self.next_report = math.inf

    def report(self, now: float) -> None:
        raise AssertionError("no report is due")


def _add(a: int, b: int) -> int:
    return a + b


def _pair(a: int) -> tuple[int, int]:
    return a, -a


def _boom() -> None:
    raise ValueError("boom")


def _graphs() -> dict[str, tuple[Graph, list[Any]]]:
    """Graphs the compiler takes, with their inputs on RANK."""
    made: dict[str, tuple[Graph, list[Any]]] = {}
    b = GraphBuilder(2)  # the trace's form: empty templates, the function called bare
    (one,) = b.op("pcall", [], ranks=(0, 1), fn=b.fn(lambda: 1), args=(), kwargs={})
    made["no arguments"] = (b.build([one]), [])
    b = GraphBuilder(2)
    x, y = b.input((0, 1)), b.input((1,))
    (s,) = b.op("pcall", [x, y], ranks=(1,), fn=b.fn(_add))  # no templates: inputs in order
    (c,) = b.op("constant", [], ranks=(0, 1), value=10)
    (t,) = b.op("pcall", [s, c], ranks=(1,), fn=b.fn(_add))
    p, n = b.op("pcall", [t], ranks=(1,), nout=2, fn=b.fn(_pair))
    (elsewhere,) = b.op("pcall", [], ranks=(0,), fn=b.fn(lambda: 0))  # not on RANK
    made["inputs, a constant, two outputs, an op elsewhere"] = (
        b.build([p, n, s, elsewhere]),
        [2, 3],
    )
    return made


def test_a_compiled_run_keeps_as_many_spans_as_the_interpreter() -> None:
    """Past MAX_SPANS ops, the spans of the first MAX_SPANS alone (the compiled run counts
    the ops it ran rather than the spans it kept)."""
    b = GraphBuilder(2)
    outs = [b.op("constant", [], ranks=(0, 1), value=i)[0] for i in range(MAX_SPANS + 2)]
    plan = Plan.build(b.build(outs), RANK)
    compiled = InlineRun.compile(plan)
    assert compiled is not None
    ctx = _Context()
    expected = run_graph(plan, [], ctx)  # type: ignore[arg-type]
    outputs, spans, _ = compiled.run([], 5.0, math.inf, _no_report)
    assert outputs == expected
    assert len(spans) == len(ctx.spans) == MAX_SPANS
    assert [s[:2] for s in spans] == [s[:2] for s in ctx.spans]


@pytest.mark.parametrize("name", list(_graphs()))
def test_a_compiled_run_gives_what_the_interpreter_gives(name: str) -> None:
    graph, inputs = _graphs()[name]
    plan = Plan.build(graph, RANK)
    compiled = InlineRun.compile(plan)
    assert compiled is not None
    ctx = _Context()
    expected = run_graph(plan, inputs, ctx)  # type: ignore[arg-type]
    outputs, spans, end = compiled.run(inputs, 5.0, math.inf, _no_report)
    assert outputs == expected
    assert [s[:2] for s in spans] == [s[:2] for s in ctx.spans]
    starts, ends = [s[2] for s in spans], [s[3] for s in spans]
    assert starts[0] == 0.0 and starts[1:] == ends[:-1]  # an op starts as the last ended
    assert end - 5.0 == ends[-1]


def _no_report(done: int, index: int, now: float) -> float:
    raise AssertionError("no report is due")


def test_a_failing_op_fails_as_in_the_interpreter() -> None:
    b = GraphBuilder(2)
    (one,) = b.op("pcall", [], ranks=(RANK,), fn=b.fn(lambda: 1))
    (bad,) = b.op("pcall", [], ranks=(RANK,), fn=b.fn(_boom))
    plan = Plan.build(b.build([one, bad]), RANK)
    compiled = InlineRun.compile(plan)
    assert compiled is not None
    with pytest.raises(OpFailed) as by_interpreter:
        run_graph(plan, [], _Context())  # type: ignore[arg-type]
    with pytest.raises(OpFailed) as compiled_run:
        compiled.run([], 0.0, math.inf, _no_report)
    assert compiled_run.value.label == by_interpreter.value.label
    assert type(compiled_run.value.cause) is ValueError


def test_a_due_report_is_made_at_an_op_start_with_where_the_run_is() -> None:
    b = GraphBuilder(2)
    first = b.op("pcall", [], ranks=(RANK,), fn=b.fn(lambda: 1))
    b.op("pcall", [], ranks=(0,), fn=b.fn(lambda: 0))
    (last,) = b.op("pcall", first, ranks=(RANK,), fn=b.fn(abs))
    compiled = InlineRun.compile(Plan.build(b.build([last]), RANK))
    assert compiled is not None
    reports: list[tuple[int, int]] = []

    def report(done: int, index: int, now: float) -> float:
        reports.append((done, index))
        return math.inf  # the next one: never

    outputs, _, _ = compiled.run([], 0.0, -1.0, report)  # due from the start
    assert outputs == [1] and reports == [(0, 0)]


def test_ops_it_does_not_compile_are_left_to_the_interpreter() -> None:
    def plan_of(opcode: str, **attrs: Any) -> Plan:
        b = GraphBuilder(2)
        (x,) = b.op("pcall", [], ranks=(0, 1), fn=b.fn(lambda: (1, 2)), args=(), kwargs={})
        if opcode == "getitem":
            (out,) = b.op("getitem", [x], ranks=(0, 1), key=0)
        else:
            (out,) = b.op("pcall", [x], ranks=(0, 1), **attrs)
        return Plan.build(b.build([out]), RANK)

    kernel = GraphBuilder(2)
    (named,) = kernel.op("pcall", [], ranks=(0, 1), fn=kernel.fn(KernelRef("k.add")))
    templated = plan_of("pcall", fn=0, args=(Arg(0),), kwargs={})
    for plan in (plan_of("getitem"), templated, Plan.build(kernel.build([named]), RANK)):
        assert InlineRun.compile(plan) is None
    # and an input this rank does not hold stays absent, as in the interpreter
    b = GraphBuilder(2)
    x = b.input((0,))
    (y,) = b.op("pcall", [], ranks=(RANK,), fn=b.fn(lambda: 3))
    compiled = InlineRun.compile(Plan.build(b.build([x, y]), RANK))
    assert compiled is not None
    assert compiled.run([ABSENT], 0.0, math.inf, _no_report)[0] == [ABSENT, 3]


def test_a_program_of_one_call_without_arguments_is_that_call() -> None:
    """``InlineRun.call``: the function of a program whose one op here is a call without
    arguments and whose one output is its value (the job shell then makes the call
    itself); None for any other program."""

    def one() -> int:
        return 1

    b = GraphBuilder(2)
    (out,) = b.op("pcall", [], ranks=(0, 1), fn=b.fn(one), args=(), kwargs={})
    compiled = InlineRun.compile(Plan.build(b.build([out]), RANK))
    assert compiled is not None and compiled.call is one and compiled.only is not None
    others: list[Graph] = []
    b = GraphBuilder(2)
    x = b.input((0, 1))
    others.append(b.build([b.op("pcall", [x], ranks=(0, 1), fn=b.fn(abs))[0]]))  # an input
    b = GraphBuilder(2)
    pair = b.op("pcall", [], ranks=(0, 1), nout=2, fn=b.fn(lambda: (1, 2)))
    others.append(b.build([pair[0]]))  # two values
    b = GraphBuilder(2)
    (a,) = b.op("pcall", [], ranks=(0, 1), fn=b.fn(one))
    (c,) = b.op("constant", [], ranks=(0, 1), value=3)
    others.append(b.build([a, c]))  # two ops here
    b = GraphBuilder(2)
    (c,) = b.op("constant", [], ranks=(0, 1), value=3)
    others.append(b.build([c]))  # no call
    b = GraphBuilder(2)
    (a,) = b.op("pcall", [], ranks=(0, 1), fn=b.fn(one))
    others.append(b.build([a, a]))  # two outputs
    for graph in others:
        compiled = InlineRun.compile(Plan.build(graph, RANK))
        assert compiled is not None and compiled.call is None
