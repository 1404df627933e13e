"""Data family: reading and freeing stored values, and peer-to-peer moves.

``Fetch`` and ``Delete`` go driver -> broker -> worker; the fetch answer comes back as a
``Reply``. ``Move`` goes straight from one worker's PUSH to another's PULL: it never touches
the broker. A move is keyed by (session, job, op, seq, src, sealer); the receiver keeps the
first copy and discards duplicates, so delivery is exactly once in any arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpl.wire.record import Record

__all__ = ["Delete", "Fetch", "Move"]


@dataclass(eq=False, repr=False)
class Fetch(Record, tag="fetch"):
    """Bring the value stored as ``uri`` on ``rank`` back to the driver.

    Secure mode: the worker seals the value for ``reply_to`` (a driver identity its own spec
    lists, and that the session's owner's sealed word admits: ``mpl.worker.admission``; the
    broker writes this field), bound to ``ticket``, a fresh random string per request, so an
    old reply replayed by the broker does not open.
    """

    session: str
    req: int
    rank: int
    uri: str
    reply_to: str = ""
    ticket: str = ""


@dataclass(eq=False, repr=False)
class Delete(Record, tag="delete"):
    """Free values the driver no longer references, per rank (batched)."""

    session: str
    uris: dict[int, list[str]]


@dataclass(eq=False, repr=False)
class Move(Record, tag="move"):
    """One value from rank ``src`` to rank ``dst`` for op ``op`` of ``job``.

    ``seq`` tells apart the moves of one op (several sources, or an op that repeats).

    ``sealer`` (secure mode) is the driver that sealed the sending rank's job, as that
    worker opened it ("" in plaintext): the receiver hands the value only to a job of the
    same session and job id sealed by the same driver. A broker can make another driver's
    job of that id run on the receiving rank (a session not bound there yet); the value of
    the sealer's job never reaches it. The sender's connection proves its rank, and a
    hostile sender holds the value it sends anyway, so its word on the sealer is enough.
    """

    session: str
    job: str
    op: int
    seq: int
    src: int
    dst: int
    value: Any
    sealer: str = ""
