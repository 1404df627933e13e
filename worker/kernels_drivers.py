"""What the drivers a node's own spec lists with ``code: kernels`` may run on this worker
(secure mode). No I/O.

Such a driver is held to the kernels-only policy on a ``--code any`` worker too, by its
authenticated sealer (``mpl.worker.sealing``): its program or bindings open as under
``--code kernels``, with pickles left opaque. This table says what its job may not run:
bindings holding pickles, a program of its own that held some (dropped when it arrived),
or a program of code another driver shipped, for as long as this worker holds it.
"""

from __future__ import annotations

import weakref
from typing import Any

from mpl.wire.graph import Graph
from mpl.wire.lru import LRU
from mpl.wire.remote import ErrorInfo
from mpl.wire.replay import claimed_stream
from mpl.worker.code_policy import REFUSAL, holds_pickle

__all__ = ["KernelsDrivers"]


class KernelsDrivers:
    """The ``code: kernels`` drivers (identities, :attr:`names`) and the programs their
    jobs may not run here."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        # digest -> graph of the programs that held pickles when they opened here (for an
        # allowed driver): refused to these drivers' jobs. Weak: an entry lives as long as
        # its graph does (the worker's program cache, a job running it), no longer.
        self.code_programs: weakref.WeakValueDictionary[str, Graph] = weakref.WeakValueDictionary()
        # digest -> why: programs one of these drivers sealed that held pickles (dropped);
        # its jobs naming them are refused saying why (no other driver's jobs are affected)
        self._dropped: LRU[str, str] = LRU(256)

    def claims(self, sealed: Any) -> bool:
        """Whether ``sealed`` says one of these drivers sealed it (its claim, read before
        it opens: opening authenticates exactly that sender, or fails)."""
        claimed = claimed_stream(sealed)
        return claimed is not None and claimed[0] in self.names

    def drop(self, digest: str, graph: Graph) -> None:
        """One of these drivers sealed program ``digest``, which holds pickles: dropped,
        and its jobs naming it are refused saying why."""
        self._dropped[digest] = REFUSAL.format(what=f"program {graph.name or digest}")

    def keep_code(self, digest: str, graph: Graph) -> None:
        """An allowed driver's program of code opened here: kept from these drivers' jobs
        for as long as its graph lives."""
        self.code_programs[digest] = graph

    def refusal(self, digest: str, job: str, mine: Any, rank: int) -> ErrorInfo | None:
        """Why a job of one of these drivers may not run here (None: it may): its bindings
        ``mine`` hold pickles (opened opaque), or its program held some when it opened."""
        if holds_pickle(mine):
            why = REFUSAL.format(what="the job's inputs")
        elif (held := self.code_programs.get(digest)) is not None:
            why = REFUSAL.format(what=f"program {held.name or digest}")
        elif (dropped := self._dropped.get(digest)) is not None:
            why = dropped
        else:
            return None
        why = f"{why} (this worker's spec lists its driver with code: kernels)"
        return ErrorInfo(
            "RemoteError", why, rank=rank, op="program", remote_type="PermissionError",
            job=job,
        )  # fmt: skip
