"""The moves a job's group keeps (``worker/move_keys.py``) are exactly those its kernels
take: every ``ctx.recv`` a rank's run makes is listed, and nothing else (red team w32,
R32-3: an open job's group refuses every other key)."""

from __future__ import annotations

import contextlib
from typing import Any

from mpl.wire.graph import Graph, GraphBuilder
from mpl.worker.interpreter import ABSENT, KERNELS
from mpl.worker.move_keys import MoveSlot, moves_in


class _Recording:
    """A job's context that notes what a kernel receives and sends nothing anywhere."""

    session, job, sealer = "s", "j", ""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.taken: list[MoveSlot] = []

    def send(self, dst: int, op: int, seq: int, value: Any) -> None:
        pass

    def recv(self, src: int, op: int, seq: int) -> Any:
        self.taken.append((op, seq, src))
        return 0


def _graph() -> Graph:
    b = GraphBuilder(4)
    x = b.op("constant", [], ranks=(2,), value=1)[0]
    y = b.op("shuffle", [x], ranks=(0, 2, 3), routing={0: 2, 3: 2, 2: 2})[0]
    config = {"protocol": "SEMI2K", "field": "FM64", "fxp_fraction_bits": 18}
    s = b.op("spu.seal", [x], ranks=(0, 1, 2), device="SP", members=(0, 1), config=config)[0]
    b.op("spu.reveal", [s], ranks=(0, 1, 3), to=3, device="SP", members=(0, 1), config=config)
    b.op("spu.reveal", [s], ranks=(0, 1), to=1, device="SP", members=(0, 1), config=config)
    return b.build([y])


def test_a_rank_keeps_exactly_the_moves_its_kernels_take() -> None:
    graph = _graph()
    for rank in range(4):
        ctx = _Recording(rank)
        for k, op in enumerate(graph.ops):
            if op.opcode == "constant" or rank not in op.ranks:
                continue
            with contextlib.suppress(Exception):  # reconstructing zeros, sharing ABSENT
                KERNELS[op.opcode](ctx, graph, k, op, [ABSENT])  # type: ignore[arg-type]
        assert sorted(ctx.taken) == sorted(moves_in(graph, rank)), rank
    # what the graph says, written out: shuffle to 0 and 3 from 2; seal from owner 2 to
    # members 0 (seq 0) and 1 (seq 1); reveal to 3 from 0 and 1, to 1 from 0
    assert moves_in(graph, 0) == {(1, 0, 2), (2, 0, 2)}
    assert moves_in(graph, 1) == {(2, 1, 2), (4, 0, 0)}
    assert moves_in(graph, 2) == set()
    assert moves_in(graph, 3) == {(1, 0, 2), (3, 0, 0), (3, 1, 1)}
