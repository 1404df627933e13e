"""Graph IR: building, the printer's exact text, the checker's errors, and the digest."""

from __future__ import annotations

import numpy as np
import pytest

from mpl.wire import Arg, Graph, GraphBuilder, GraphError, Op, check, decode, encode, fill


def double(x: int) -> int:
    return 2 * x


def sample() -> Graph:
    b = GraphBuilder(3, "pipeline")
    x = b.input((0,))
    c = b.op("constant", [], ranks=(1,), value=np.zeros((2, 2)))[0]
    y = b.op("pcall", [x], ranks=(0,), fn=b.fn(double), args=(Arg(0),))[0]
    z = b.op("shuffle", [y], ranks=(0, 1, 2), routing={1: 0, 2: 0})[0]
    w = b.op("converge", [x, c], ranks=(0, 1))[0]
    k = b.op("getitem", [w], ranks=(0, 1), key=0)[0]
    again = b.op("pcall", [z], ranks=(1, 2), fn=b.fn(double), args=(Arg(0),), nout=1)[0]
    return b.build([again, k])


GOLDEN = """\
graph pipeline(%0: @0) world=3 {
  %1 = constant[value=array<float64[2, 2]>]() on @1 -> @1
  %2 = pcall[args=($0), fn=double](%0) on @0 -> @0
  %3 = shuffle[routing={1: 0, 2: 0}](%2) on @0,1,2 -> @1,2
  %4 = converge(%0, %1) on @0,1 -> @0,1
  %5 = getitem[key=0](%4) on @0,1 -> @0,1
  %6 = pcall[args=($0), fn=double](%3) on @1,2 -> @1,2
  return %6, %5
}"""


def test_printer_golden_text() -> None:
    assert str(sample()) == GOLDEN


def test_functions_are_stored_once_and_survive_the_wire() -> None:
    g = sample()
    assert len(g.fns) == 1
    back = decode(encode(g))
    assert isinstance(back, Graph)
    assert back.fns[0](21) == 42
    assert str(back) == GOLDEN


def test_digest_is_stable_and_content_sensitive() -> None:
    assert sample().digest == sample().digest
    b = GraphBuilder(3)
    b.input((0,))
    assert b.build([0]).digest != sample().digest


def test_placements() -> None:
    assert sample().placements[3] == (1, 2)


def test_fill_templates() -> None:
    assert fill((Arg(1), [Arg(0)], {"k": Arg(1)}, 5), ["a", "b"]) == ("b", ["a"], {"k": "b"}, 5)


def graph(
    *ops: Op,
    inputs: tuple[tuple[int, ...], ...] = ((0,),),
    outputs: tuple[int, ...] = (),
    world: int = 2,
) -> Graph:
    return Graph(world, inputs, ops, outputs, (abs,))


@pytest.mark.parametrize(
    ("g", "message"),
    [
        (graph(Op("pcall", (5,), 1, (0,), {"fn": 0})), r"op 0 \(pcall\): input %5 is not defined"),
        (graph(Op("teleport", (0,), 1, (0,), {})), r"unknown opcode 'teleport'"),
        (graph(Op("pcall", (0,), 1, (0, 7), {"fn": 0})), r"rank out of range"),
        (graph(Op("pcall", (0,), 1, (1, 0), {"fn": 0})), r"sorted, unique"),
        (
            graph(Op("shuffle", (0, 0), 1, (0, 1), {"routing": {1: 0}})),
            r"shuffle takes 1 input\(s\), got 2",
        ),
        (
            graph(Op("constant", (), 2, (0,), {"value": 1})),
            r"constant has 1 output\(s\), got nout=2",
        ),
        (graph(Op("pcall", (0,), 1, (0, 1), {"fn": 0})), r"held only by @0: not covered on @1"),
        (graph(Op("pcall", (0,), 1, (0,), {"fn": 3})), r"'fn' must index"),
        (
            graph(Op("shuffle", (0,), 1, (0, 1), {"routing": {0: 1}})),
            r"source rank\(s\) @1 do not hold",
        ),
        (graph(Op("shuffle", (0,), 1, (0,), {"routing": {1: 0}})), r"must run on ranks @0,1"),
        (graph(Op("shuffle", (0,), 1, (0, 1), {"routing": {}})), r"non-empty attribute 'routing'"),
        (
            graph(Op("converge", (0, 1), 1, (0, 1)), inputs=((0,), (0, 1))),
            r"disjoint ranks; @0 hold",
        ),
        (graph(Op("getitem", (0,), 1, (0,), {})), r"needs attribute 'key'"),
        (graph(outputs=(4,)), r"output %4 is not defined"),
        (graph(inputs=((),)), r"input %0: ranks must be a non-empty tuple"),
        (graph(inputs=((2,),)), r"input %0: rank out of range"),
    ],
)
def test_checker_errors(g: Graph, message: str) -> None:
    with pytest.raises(GraphError, match=message):
        check(g)


def test_builder_reports_errors_at_trace_time() -> None:
    b = GraphBuilder(2)
    x = b.input((0,))
    with pytest.raises(GraphError, match="not covered"):
        b.op("pcall", [x], ranks=(1,), fn=b.fn(abs))


def test_builder_accepts_late_inputs_and_renumbers() -> None:
    b = GraphBuilder(2)
    x = b.input((0,))
    y = b.op("pcall", [x], ranks=(0,), fn=b.fn(abs))[0]
    late = b.input((0,))  # e.g. a value captured halfway through a trace
    z = b.op("pcall", [y, late], ranks=(0,), fn=b.fn(max))[0]
    g = b.build([z])
    assert g.inputs == ((0,), (0,))
    assert [op.inputs for op in g.ops] == [(0,), (2, 1)]
    assert g.outputs == (3,)
