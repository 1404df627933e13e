"""The ``save`` and ``load`` ops: ``mp.save`` / ``mp.load`` inside ``@mp.function``.

They run inside the job, on the ranks that hold the value (save) or read it (load), with
the same rules as ``SaveSymbol`` and ``sym:`` reads outside a program:

* the name is checked with :func:`mpl.wire.limits.check_symbol_name` before anything is
  written or read, so a name never becomes a path outside the data root;
* a session name goes into this rank's store for the job's session; a persisted one is
  written by :class:`~mpl.worker.symbol_disk.SymbolDisk` under this party's own
  namespace (this worker's data root), never anyone else's;
* a load reads the session's own value first, else this rank's persisted file;
* on a secure worker a persisted value is owned by the driver that sealed the job saving
  it, read only in sessions bound here to that driver, and replaced or deleted (the
  ``unsave`` op, ``mp.delete``'s sealed half) only by its jobs (``mpl.worker.symbol_owner``);
  another driver's ``load`` or ``unsave`` of its name answers as of a name nothing is
  persisted under.

Each save is recorded on the job (``ctx.saved``) and listed in this rank's ``Done``: that
is how the broker learns the names a job saved, from the workers that wrote them rather
than from anything the driver claimed.
"""

from __future__ import annotations

from typing import Any

from mpl.wire.errors import SessionAccessError, SessionError
from mpl.wire.graph import Graph, Op
from mpl.wire.limits import MAX_JOB_SAVES, check_symbol_name
from mpl.wire.sessions import SymbolInfo
from mpl.worker.interpreter import ABSENT, JobContext, kernel
from mpl.worker.outputs import describe
from mpl.worker.store import symbol_uri

__all__ = ["load_op", "save_op", "unsave_op"]


def _writer(ctx: JobContext) -> str | None:
    """Who writes for ``ctx``'s job: on a secure worker (one whose store reads persisted
    values by their owner) the driver that sealed the job; None on a plaintext one."""
    return None if ctx.store.owner_of is None else ctx.sealer


@kernel("save")
def save_op(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    name = check_symbol_name(op.attrs["symbol"])
    if len(ctx.saved) >= MAX_JOB_SAVES:
        raise SessionError(f"a job saves at most {MAX_JOB_SAVES} names per rank")
    value = args[0]
    if value is ABSENT:  # a graph the driver's checker would have refused: name nothing
        raise SessionError(f"rank {ctx.rank} does not hold the value to save as {name!r}")
    persist: bool = op.attrs["persist"]
    meta = {"meta": describe(value)}
    info = SymbolInfo(name, op.attrs.get("device", ""), op.ranks, persist, meta)
    if persist:
        if ctx.store.disk is None:
            raise SessionError("this worker has no data root to persist values in")
        # the old value stays whole if the write fails, or is another driver's
        ctx.store.disk.save(info, value, _writer(ctx))
    else:
        ctx.store.put(ctx.session, symbol_uri(name), value)
    ctx.saved.append(info)
    return []


@kernel("load")
def load_op(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    name = check_symbol_name(op.attrs["symbol"])
    try:
        return [ctx.store.get(ctx.session, symbol_uri(name))]
    except SessionAccessError:  # a file of no owner, or a session bound to none: say so
        raise
    # none here, or another driver's (SymbolDisk answers that as none, from the same line):
    # one answer, raised here, so the two differ by the name alone (traceback included)
    except SessionError:  # a damaged file is a ProtocolError, and says so itself
        raise SessionError(
            f"no value named {name!r} in this session or persisted by rank {ctx.rank}'s "
            "party; save it first (or say whose with parties=)"
        ) from None


@kernel("unsave")
def unsave_op(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    """Delete this rank's persisted ``symbol``: on a secure worker, only its owner's job."""
    name = check_symbol_name(op.attrs["symbol"])
    if ctx.store.disk is None:
        raise SessionError("this worker has no data root to delete persisted values from")
    ctx.store.disk.delete(name, _writer(ctx))
    return []
