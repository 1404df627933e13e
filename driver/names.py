"""Named values: ``mp.save``, ``mp.load``, ``mp.delete``.

A name lives in the session (any driver attached to it can load it) or, with
``persist=True``, on the disks of the workers holding the value, where it outlives the
session and restarts and any later session can load it. Each party persists under its
own namespace: two parties saving ``model`` keep two values, chosen with ``parties=``.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpl.driver.context import current
from mpl.driver.recorder import active
from mpl.driver.values import Value
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import MplError
from mpl.wire.sessions import SymbolInfo

__all__ = ["delete", "load", "save"]


def save(value: Value, name: str, *, persist: bool = False) -> None:
    """Name ``value`` in the session; ``persist=True`` also writes it to the disks of the
    workers holding it, each under its own party's namespace.

    Inside ``@mp.function`` the save is part of the call: the value becomes an output of
    the function's job and is named as soon as the job has run (before the call returns).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a name must be a non-empty string, got {name!r}")
    rec = active()
    if rec is not None:
        rec.saves.append((rec.of(value), name, persist, value.device))
        return
    if value.traced:
        raise MplError("a traced value is saved inside its own @mp.function trace only")
    ctx = value._ctx or current()
    ctx.flush()
    info = SymbolInfo(name, value.device or "", value.parties, persist, {"meta": value._meta})
    ctx.client.save_symbol(ctx.session, value._uri, info)


def load(name: str, parties: int | str | Sequence[int | str] | None = None) -> Value:
    """The value saved as ``name``: the session's own, else a persisted one.

    Persisted names belong to the parties that wrote them (each party's own namespace).
    ``parties`` (ranks, or PPU device names) says whose; without it, every party holding
    ``name`` must hold one value (an SPU value's shares, a multi-party value), else the
    load is refused naming the parties. Several parties given explicitly make one
    party-level Value spanning them.

    Inside ``@mp.function`` the name is looked up when the function is traced (and again
    in each new session that runs it) and read by the workers when its job runs.
    """
    ctx = current()
    ranks = _ranks(ctx.cluster, parties)
    info = ctx.client.load_symbol(ctx.session, name, parties=ranks)
    device = info.device or None
    if device is None and len(info.ranks) == 1:
        device = ctx.cluster.ppu_of(info.ranks[0])
    rec = active()
    if rec is not None:  # in @mp.function: an input of the job, read when it runs
        return rec.traced_value(rec.symbol(name, tuple(info.ranks), ranks), device)
    return Value(
        device,
        tuple(info.ranks),
        ctx=ctx,
        uri=f"sym:{name}",
        owned=False,
        meta=str(info.meta.get("meta", "")),
    )


def _ranks(
    cluster: ClusterSpec, parties: int | str | Sequence[int | str] | None
) -> tuple[int, ...]:
    if parties is None:
        return ()
    items = [parties] if isinstance(parties, (int, str)) else list(parties)
    out: set[int] = set()
    for item in items:
        if isinstance(item, str):
            out.update(cluster.ranks(item))
        elif isinstance(item, int) and 0 <= item < cluster.world_size:
            out.add(item)
        else:
            raise ValueError(
                f"parties: {item!r} is neither a rank in 0..{cluster.world_size - 1} "
                "nor a device name"
            )
    return tuple(sorted(out))


def delete(*items: str | Value, parties: int | str | Sequence[int | str] | None = None) -> None:
    """Forget names (and their files when persisted), or free Values now. ``parties``
    says whose persisted value a name means, as for :func:`load`."""
    ctx = current()
    ranks = _ranks(ctx.cluster, parties)
    for item in items:
        if isinstance(item, Value):
            if item._owned and item._ctx is not None:
                item._owned = False
                item._ctx.release(item.parties, item._uri)
        else:
            ctx.client.delete_symbol(ctx.session, item, parties=ranks)
    ctx.flush()
