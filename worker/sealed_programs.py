"""The programs drivers seal for a worker's rank (secure mode): each opened as it arrives,
and which were refused here, and why. No I/O.

A ``Program`` opens only if a driver of this worker's own spec sealed it for this rank and
this digest (``mpl.worker.sealing``); otherwise it is never handed on to be cached, and a
job naming its digest is refused saying why (:attr:`SealedPrograms.refused`). A digest
whose program opened here as itself (its graph's own digest: :attr:`SealedPrograms.genuine`)
is refused by no later copy that does not open (another driver's junk sealed under it).

Bounded: the last ``PROGRAMS_REMEMBERED`` (4,096) digests of each table, the oldest going
first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpl.wire.errors import AuthenticationError, ProtocolError
from mpl.wire.graph import Graph
from mpl.wire.jobs import Program
from mpl.wire.limits import MAX_DIGEST_CHARS
from mpl.wire.lru import LRU
from mpl.wire.seal import Sealer, program_context
from mpl.worker.code_policy import holds_pickle, open_sealed
from mpl.worker.kernels_drivers import KernelsDrivers

__all__ = ["PROGRAMS_REMEMBERED", "SealedPrograms"]

PROGRAMS_REMEMBERED = 4096

# opens what a driver sealed under a context: (its sealer, what it held) (WorkerSeal._open)
OpenPayload = Callable[[Any, str], tuple[str, Any]]


class SealedPrograms:
    """Opens the programs sealed for rank ``rank``; remembers which were refused and which
    opened as themselves. The I/O thread alone opens them; :attr:`refused` is read by
    single lookups (a job's program refused?) on its hot path."""

    def __init__(
        self,
        sealer: Sealer,
        rank: int,
        kernels: KernelsDrivers,
        memory: int = PROGRAMS_REMEMBERED,
    ) -> None:
        self.sealer = sealer
        self.rank = rank
        self._kernels = kernels  # the code: kernels drivers (none under --code kernels)
        self.refused: LRU[str, str] = LRU(memory)  # program digest -> why it did not open
        # digests whose program opened here as itself (its graph's own digest): a copy that
        # does not open later (another driver's, sealed under that digest) refuses no job
        self.genuine: LRU[str, bool] = LRU(memory)
        self.refusals = 0  # programs that did not open here

    def open(self, msg: Program, open_payload: OpenPayload) -> Program | None:
        """``msg`` opened (its graph), to be handed on and cached; None if it did not open
        (refused, saying why, to the jobs naming it) or one of the ``code: kernels``
        drivers sealed it holding code (dropped: ``KernelsDrivers.drop``).
        ``open_payload``: how this worker opens a driver's sealed payload."""
        if len(msg.digest) > MAX_DIGEST_CHARS:  # names no program: kept nowhere
            self.refusals += 1
            return None
        kernels_drivers = self._kernels.names
        sealed, context = msg.sealed.get(self.rank), program_context(msg.digest)
        try:
            if kernels_drivers:  # screened, whoever sealed it: does it hold code?
                driver, graph = open_sealed(self.sealer, sealed, context)
            else:
                driver, graph = open_payload(sealed, context)
            if not isinstance(graph, Graph):
                raise ProtocolError(f"program {msg.digest} holds a {type(graph).__name__}")
        except (AuthenticationError, ProtocolError) as exc:
            self.refusals += 1
            if msg.digest not in self.genuine:  # (a genuine copy stays usable)
                self.refused[msg.digest] = f"{type(exc).__name__}: {exc}"
            return None
        self.refused.pop(msg.digest, None)
        # (a graph under another's digest is the state's to refuse: it names nothing here)
        if kernels_drivers and holds_pickle(graph) and graph.digest == msg.digest:
            if driver in kernels_drivers:  # dropped: its jobs are refused saying why
                self._kernels.drop(msg.digest, graph)
                return None
            # an allowed driver's program of code: opened in full, and kept from
            # kernels_drivers' jobs for as long as its graph lives here
            try:  # (the plaintext that opened above: its digest is checked)
                graph = self.sealer.open(sealed, context, safe=False)[1]
            except (AuthenticationError, ProtocolError) as exc:  # it does not load here
                self.refusals += 1
                self.refused[msg.digest] = f"{type(exc).__name__}: {exc}"
                return None
            self._kernels.keep_code(msg.digest, graph)
        if graph.digest == msg.digest:  # handed on to be cached, as itself
            self.genuine[msg.digest] = True
        return Program(msg.digest, graph)
