"""Session family: a driver's isolated workspace on the cluster, and named values in it.

::

    driver                           broker                        workers
      | -- OpenSession ------------>  |   with its own spec: each named node's worker
      |                                | -- SessionRuntime -----------> |  checks, keeps
      |                                | <------------------- Ack ----- |  its runtime_info
      | <------------ SessionOpened -  |   session id, cluster, directory (or a refusal)
      | -- SaveSymbol -------------->  | -- SaveSymbol --------------> |  alias (and file)
      | <------------------- Reply --  | <------------------- Ack ---- |
      | -- LoadSymbol -------------->  |   answered from the broker's table
      | -- DeleteSymbol ------------>  | -- DeleteSymbol ------------> |
      | -- CloseSession ------------>  | -- SessionClosed -----------> |  free every object
      | -- CloseNamed (owner) ------>  | -- SessionClosed -----------> |  the same, by name
      | -- ListRequest ------------->  |   answered from the broker's tables

A session whose drivers stopped heartbeating for its lease is closed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpl.wire.limits import MAX_MESSAGE
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo

__all__ = [
    "LISTINGS",
    "Ack",
    "CloseNamed",
    "CloseSession",
    "DeleteSymbol",
    "ListRequest",
    "LoadSymbol",
    "OpenSession",
    "Reply",
    "SaveSymbol",
    "SessionClosed",
    "SessionOpened",
    "SessionRuntime",
    "StatusRequest",
    "SymbolInfo",
]


@dataclass(eq=False, repr=False)
class OpenSession(Record, tag="open"):
    """Create a session, or attach to the named one if it exists.

    The session belongs to the driver identity that opens it; only that identity and the
    driver names in ``share_with`` may attach to it or act in it. ``share_with`` is set
    when the owner opens or re-attaches (a list replaces the previous one; ``None`` keeps
    it); anyone else sending one is refused.
    """

    req: int
    # the session's name (at most 128 characters); its id is ``<name>~<24 base64url>``
    # (``mpl.wire.session_word.session_id``); "": the broker picks an id (older drivers:
    # a driver names even its own fresh session, to check the id it is answered with)
    name: str
    lease_s: float
    client: str  # the driver client's id: attachments are counted per client
    share_with: list[str] | None = None  # driver names (not identities) let in besides
    # the session's own spec (dict form): its nodes are named nodes of the broker's
    # cluster, its devices are the session's (mpl.wire.session_cluster); None: the broker's
    cluster: dict[str, Any] | None = None


@dataclass(eq=False, repr=False)
class SessionOpened(Record, tag="opened"):
    """``incarnations``: each live worker's public incarnation by rank
    (``mpl.wire.incarnation``), for a secure driver to bind what it seals for that worker
    to it. Only a hint from the broker: a wrong one makes that worker refuse the driver's
    next job, with its own incarnation in the refusal (``mpl.wire.replay``).

    ``max_message``: the broker's ``--max-message``, the largest frame it takes; the driver
    refuses a bigger Exec or program before sending it (``MessageTooLargeError``), taking
    the figure for at least ``MIN_MAX_MESSAGE`` (``mpl.wire.sockets.announced_limit``)."""

    req: int
    session: str
    broker_id: str
    cluster: dict[str, Any]
    heartbeat_s: float
    attached: bool  # True when the session already existed
    incarnations: dict[int, str] = field(default_factory=dict)
    max_message: int = MAX_MESSAGE


@dataclass(eq=False, repr=False)
class SessionRuntime(Record, tag="runtime"):
    """Broker to a worker, when a session opens with its own spec naming the worker's node:
    that node's ``runtime_info`` in the session. The worker answers with an ``Ack``; an
    error in it (``ClusterSpecError``: a version or platform it cannot serve, see
    :mod:`mpl.wire.runtime_info`) refuses the session, and the driver's open fails with it.
    ``req`` 0 asks for no answer (a worker that joins after the session opened).
    ``spu_devices``: the session's SPU devices, each with its members' ranks: the only
    devices a member runs the session's SPU ops on (red team w33, R33-4)."""

    session: str
    req: int
    runtime_info: dict[str, Any]
    spu_devices: dict[str, list[int]] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class CloseSession(Record, tag="close"):
    """The client detaches; the session closes when no client is left."""

    session: str
    client: str


@dataclass(eq=False, repr=False)
class SessionClosed(Record, tag="closed"):
    """Broker to workers: free everything the session holds."""

    session: str
    reason: str


@dataclass(eq=False, repr=False)
class SymbolInfo(Record, tag="symbol"):
    """What a name stands for: where the value lives and what it looked like."""

    name: str
    device: str
    ranks: tuple[int, ...]
    persist: bool
    meta: dict[str, Any]


@dataclass(eq=False, repr=False)
class SaveSymbol(Record, tag="save"):
    """Name the value at ``uri`` (held by ``info.ranks``) in the session, or on disk.

    Plaintext only: it is the broker's word, so a secure worker refuses it
    (``AuthenticationError``, op ``save``); a secure driver saves by a sealed job instead
    (``mpl.driver.names``), which records it as the value's owner."""

    session: str
    req: int
    uri: str
    info: SymbolInfo


@dataclass(eq=False, repr=False)
class LoadSymbol(Record, tag="load"):
    """Load ``name``: the session's own first, else what ``parties`` (ranks; ``()``: every
    rank that has it) persisted under that name, each in its own namespace."""

    session: str
    req: int
    name: str
    parties: tuple[int, ...] = ()


@dataclass(eq=False, repr=False)
class DeleteSymbol(Record, tag="unsave"):
    """Forget ``name``. From a driver, ``ranks`` says whose persisted value (``()``: the
    one value the name resolves to); to a worker, the ranks that delete. A secure worker
    deletes no file on it (refused while one is there): the owner's sealed job (an
    ``unsave`` op) deletes it first, and this settles the broker's table."""

    session: str
    req: int
    name: str
    ranks: tuple[int, ...] = ()
    persist: bool = False


@dataclass(eq=False, repr=False)
class Ack(Record, tag="ack"):
    """A worker's answer to a fanned-out request (save, delete symbol)."""

    req: int
    rank: int
    error: ErrorInfo | None = None


LISTINGS = ("sessions", "symbols", "programs")


@dataclass(eq=False, repr=False)
class ListRequest(Record, tag="listing"):
    """A driver asks what it may see: ``what`` is one of :data:`LISTINGS`. ``sessions``:
    the caller's own sessions in full, the others only counted; ``symbols``: the names of
    ``session`` (if given) and the persisted names, per party; ``programs``: the programs
    the broker caches for the caller. The ``Reply`` holds a dict."""

    req: int
    what: str
    session: str = ""


@dataclass(eq=False, repr=False)
class CloseNamed(Record, tag="closenamed"):
    """Close the session called ``name`` for every client attached to it, freeing its
    values on the workers; only the session's owner may, from any of its drivers."""

    req: int
    name: str


@dataclass(eq=False, repr=False)
class StatusRequest(Record, tag="status"):
    req: int


@dataclass(eq=False, repr=False)
class Reply(Record, tag="reply"):
    """The answer to a driver request ``req``: a value, or an error."""

    req: int
    value: Any = None
    error: ErrorInfo | None = None
