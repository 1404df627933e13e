"""Control family: how workers join the broker and how everyone proves they are alive.

Worker lifecycle::

    worker                           broker
      | -- WorkerHello ------------->  |   rank, incarnation, peer-data and SPU addresses
      | <------------- Welcome ------  |   accepted: cluster, heartbeat interval
      | <------------- Refused ------  |   or refused: rank taken / out of range
      | <------------- Directory ----  |   every rank's addresses, on each change
      | <-- Heartbeat ------------->   |   every HEARTBEAT_S both ways; 3 missed = dead
      | <------------- Reregister ---  |   the broker does not know this sender (it restarted)
      | -- Bye --------------------->  |   orderly exit: the broker marks the rank dead at once
      | == Channel ================>   |   from the worker's result socket: "I am rank R too"

Any message counts as a heartbeat. Drivers heartbeat too, to keep their sessions' leases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpl.wire.limits import MAX_MESSAGE
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SymbolInfo

__all__ = [
    "HEARTBEAT_LIVENESS",
    "HEARTBEAT_S",
    "Bye",
    "Channel",
    "Directory",
    "Heartbeat",
    "PeerInfo",
    "Refused",
    "Reregister",
    "Welcome",
    "WorkerHello",
]

HEARTBEAT_S = 1.0
HEARTBEAT_LIVENESS = 3  # a peer silent for HEARTBEAT_S * HEARTBEAT_LIVENESS is dead


@dataclass(eq=False, repr=False)
class PeerInfo(Record, tag="peer"):
    """Where to reach one worker directly."""

    rank: int
    incarnation: str
    data_addr: str  # the worker's PULL socket for peer moves
    spu_addr: str  # host:port of its SPU link listener ("" until it has one)
    curve_key: str = ""  # its CURVE public key (z85) when the cluster runs with --curve


@dataclass(eq=False, repr=False)
class WorkerHello(Record, tag="hello"):
    """A worker asks to serve ``rank``. ``incarnation`` is new for every process start.

    ``owners`` says whose each of ``symbols`` is (name -> the driver identity a secure
    worker wrote into the file; a name without one: no owner recorded): a secure broker
    lists a persisted name only to its owner. The worker's word about its own disk; the
    broker keeps an owner only when it is a driver of its spec."""

    rank: int
    incarnation: str
    pid: int
    host: str
    data_addr: str
    spu_addr: str
    symbols: list[SymbolInfo] = field(default_factory=list)  # values persisted on its disk
    curve_key: str = ""
    owners: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class Welcome(Record, tag="welcome"):
    """The broker accepted a worker. ``max_message``: the broker's ``--max-message``; the
    worker fails a job or fetch whose answer has a bigger frame instead of sending it
    (``MessageTooLargeError``), taking the figure for at least ``MIN_MAX_MESSAGE``."""

    rank: int
    world_size: int
    broker_id: str
    heartbeat_s: float
    cluster: dict[str, Any]
    max_message: int = MAX_MESSAGE


@dataclass(eq=False, repr=False)
class Refused(Record, tag="refused"):
    """The broker refused a worker or a request it cannot route."""

    error: ErrorInfo


@dataclass(eq=False, repr=False)
class Directory(Record, tag="directory"):
    """Every live worker's addresses, keyed by rank."""

    peers: dict[int, PeerInfo]


@dataclass(eq=False, repr=False)
class Heartbeat(Record, tag="hb"):
    """I am alive. Workers attach counters (objects held, bytes moved) for ``status``;
    drivers list the sessions whose leases they keep."""

    stats: dict[str, int] = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)
    rank: int = -1  # the sender's rank if it is a worker


@dataclass(eq=False, repr=False)
class Channel(Record, tag="channel"):
    """An extra socket of the worker serving ``rank``: its job threads send results on it,
    so answers leave without a detour through the I/O thread."""

    rank: int
    incarnation: str


@dataclass(eq=False, repr=False)
class Reregister(Record, tag="rereg"):
    """The broker does not know the sender (it restarted): say hello again."""

    broker_id: str


@dataclass(eq=False, repr=False)
class Bye(Record, tag="bye"):
    """An orderly goodbye; the receiver forgets the sender at once."""

    reason: str = ""
