"""Job family: one graph run on the ranks that take part in it.

::

    driver                   broker                         worker (each rank of the job)
      | -- Program -------->  |   graph by digest, once       |
      | -- Exec ----------->  | -- Program (if it lacks it) -> |
      |                       | -- Exec (its own bindings) --> |  runs, moves peer to peer
      |                       | <---------------- Done ------- |  small outputs inline
      |                       | <---------------- Failed ----- |  or the error, with the op
      |                       | -- Abort (the other ranks) --> |  stop waiting at once
      | <------- JobResult -  |   once: all Done, or the first failure / lost rank
      | -- Cancel --------->  |   the driver gave up (its deadline passed)

Graph values are named ``<job>/<output index>`` in the session's store on every rank that
holds them, so the driver knows the references before the job ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpl.wire.graph import Graph
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sealed import Sealed
from mpl.wire.sessions import SymbolInfo

__all__ = [
    "Abort",
    "Cancel",
    "Done",
    "Exec",
    "Failed",
    "JobResult",
    "Lit",
    "Program",
    "output_uri",
    "program_nbytes",
]


def output_uri(job: str, index: int) -> str:
    """The store name of output ``index`` of ``job``."""
    return f"{job}/{index}"


@dataclass(eq=False, repr=False)
class Lit(Record, tag="lit"):
    """A host value bound to a graph input (as opposed to a store reference)."""

    value: Any


@dataclass(eq=False, repr=False)
class Program(Record, tag="program"):
    """A graph, sent once per digest; ``Exec`` then names it by digest.

    Secure mode: ``graph`` is None and ``sealed[rank]`` holds the graph sealed by the driver
    for that rank (``mpl.wire.seal``); the broker caches and forwards it unread.
    """

    digest: str
    graph: Graph | None
    sealed: dict[int, Sealed] = field(default_factory=dict)


def program_nbytes(program: Program, rank: int | None = None) -> int:
    """What a program cache counts ``program`` as: its graph's encoded bytes, or, sealed
    (secure mode), the ciphertext sealed for ``rank`` (for every rank when None).

    The ciphertext is never smaller than the graph it opens to, so a worker counting the
    opened graph never counts more than the broker's mirror of its cache counted.
    """
    if program.graph is not None:
        return program.graph.wire_nbytes
    boxes = program.sealed.values() if rank is None else [program.sealed.get(rank)]
    return sum(
        len(box.salt) + sum(_buffer_nbytes(part) for part in box.parts)
        for box in boxes
        if box is not None
    )


def _buffer_nbytes(part: Any) -> int:
    """Bytes of one ciphertext part: bytes, a frame, or (decoded by the broker, which keeps
    buffers undecoded) an ``Opaque`` holding one."""
    try:
        return memoryview(getattr(part, "buffer", part)).nbytes
    except TypeError:
        return 0  # not a buffer: the opener refuses such a box anyway


@dataclass(eq=False, repr=False)
class Exec(Record, tag="exec"):
    """Run graph ``digest`` in ``session`` as ``job``.

    ``bindings[rank][i]`` binds graph input ``i`` on that rank: a store URI (``str``), a
    :class:`Lit`, or ``None`` where the rank does not hold the input. The broker forwards to
    each rank only its own bindings. Outputs listed in ``inline`` come back in ``Done`` when
    they are small. In secure mode ``bindings[rank]`` is that rank's list sealed for it
    (``mpl.wire.seal``), for every rank of the job.
    """

    session: str
    job: str
    digest: str
    ranks: tuple[int, ...]
    bindings: dict[int, Any]  # list[Any], or a Sealed list in secure mode
    inline: tuple[int, ...] = ()
    timeout_s: float = 0.0  # 0: the worker's default


@dataclass(eq=False, repr=False)
class Done(Record, tag="done"):
    """A rank finished its part. ``values[output index]`` holds the small outputs asked for.

    ``saved`` lists the names this rank's ``save`` ops wrote (``mp.save`` inside a program):
    the broker learns a job's names from these, each rank speaking for itself, at most
    ``MAX_JOB_SAVES`` per rank.

    ``stats`` is the rank's run stats as one opaque blob (``mpl.wire.run_stats``), which the
    broker copies into the ``JobResult`` unread. Annotated ``Any``: a blob of 1 KiB or more
    travels in a frame of its own, which the broker's decode keeps undecoded (an
    ``Opaque``); the broker checks it is a blob within ``MAX_STATS_BYTES`` itself.
    """

    session: str
    job: str
    rank: int
    values: dict[int, Any] = field(default_factory=dict)
    stats: Any = b""  # bytes: mpl.wire.run_stats.pack_stats; see above
    metas: dict[int, str] = field(default_factory=dict)  # "float64[3]"-style descriptions
    saved: list[SymbolInfo] = field(default_factory=list)


@dataclass(eq=False, repr=False)
class Failed(Record, tag="failed"):
    session: str
    job: str
    rank: int
    error: ErrorInfo


@dataclass(eq=False, repr=False)
class Abort(Record, tag="abort"):
    """Stop ``job`` on this rank: drop its state and wake anything waiting for it."""

    session: str
    job: str
    error: ErrorInfo


@dataclass(eq=False, repr=False)
class Cancel(Record, tag="cancel"):
    """The driver gives up on ``job``; the broker aborts it everywhere."""

    session: str
    job: str
    reason: str


@dataclass(eq=False, repr=False)
class JobResult(Record, tag="result"):
    """The broker's one answer to ``Exec``: ``values[output][rank]``, or an error.

    ``missing_program`` means the broker lacked the graph: send ``Program`` and retry.
    ``stats[rank]`` is that rank's stats blob as its ``Done`` carried it, read only on demand
    (``mpl.wire.run_stats.read_stats``).
    """

    job: str
    values: dict[int, dict[int, Any]] = field(default_factory=dict)
    error: ErrorInfo | None = None
    missing_program: bool = False
    stats: dict[int, bytes] = field(default_factory=dict)
    metas: dict[int, str] = field(default_factory=dict)
