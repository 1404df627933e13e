"""Which moves a job's program takes at one rank: the only ones its open group keeps.

A move is keyed ``(session, job, op, seq, src, sealer)``; within one job, the graph says
exactly which ``(op, seq, src)`` this rank receives, since only three kernels receive a
move (``ctx.recv``), each once per key:

* ``shuffle`` (``worker/interpreter.py``): from ``routing[me]``, seq 0, when that is
  another rank;
* ``spu.seal`` (``worker/spu_kernels.py``): a member other than the input's owner gets its
  share from the owner, seq = its index among the members;
* ``spu.reveal``: rank ``to`` gets every other member's share, seq = that member's index.

The graph IR has no loops, so the set is finite and known when the job's ``Exec``
arrives. A co-party's move under any other key is one the program never reads: the
mailbox refuses it rather than keep it until the job ends (red team w32, R32-3). A change
to what those kernels receive must change :func:`moves_in` with it (tests pin both).
"""

from __future__ import annotations

from mpl.wire.graph import Graph

__all__ = ["MoveSlot", "moves_in"]

MoveSlot = tuple[int, int, int]  # op, seq, src: a move's key within its job


def moves_in(graph: Graph, rank: int) -> frozenset[MoveSlot]:
    """Every ``(op, seq, src)`` a run of ``graph`` at ``rank`` receives."""
    slots: set[MoveSlot] = set()
    for k, op in enumerate(graph.ops):
        code = op.opcode
        if code == "shuffle":
            source = op.attrs["routing"].get(rank)
            if source is not None and source != rank:
                slots.add((k, 0, source))
        elif code == "spu.seal":
            members = tuple(op.attrs["members"])
            owner = graph.placements[op.inputs[0]][0]
            if rank in members and rank != owner:
                slots.add((k, members.index(rank), owner))
        elif code == "spu.reveal":
            members = tuple(op.attrs["members"])
            if rank == op.attrs["to"]:
                slots.update((k, j, m) for j, m in enumerate(members) if m != rank)
    return frozenset(slots)
