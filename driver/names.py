"""Named values: ``mp.save``, ``mp.load``, ``mp.delete``.

A name lives in the session (any driver attached to it can load it) or, with
``persist=True``, on the disks of the workers holding the value, where it outlives the
session and restarts and any later session can load it. Each party persists under its
own namespace: two parties saving ``model`` keep two values, chosen with ``parties=``.

In secure mode a save outside a function is a job of its own, sealed like every job (a
``save`` op on the value's holders), never a ``SaveSymbol``: the workers persist a value,
and record this driver as its owner, only on its sealed word. A persisted name is deleted
the same way (an ``unsave`` op on its holders, then the ``DeleteSymbol`` that settles the
broker's table). See ``mpl.worker.symbol_owner`` for who reads a persisted value.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpl.driver.context import Context, current
from mpl.driver.recorder import Recorder, active
from mpl.driver.values import Value
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import MplError, ProtocolError
from mpl.wire.graph import GraphBuilder
from mpl.wire.sessions import SymbolInfo

__all__ = ["delete", "load", "save"]


def save(value: Value, name: str, *, persist: bool = False) -> None:
    """Name ``value`` in the session; ``persist=True`` also writes it to the disks of the
    workers holding it, each under its own party's namespace.

    Inside ``@mp.function`` the save is an op of the function's one job: each worker
    holding the value names it (in the session, or in its own party's namespace on disk)
    while the job runs, and the broker learns the name from those workers' answers. The
    name is checked there; a bad one fails the job with a ``RemoteError`` naming the op.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a name must be a non-empty string, got {name!r}")
    rec = active()
    if rec is not None:
        rec.save(rec.of(value), name, persist, value.device)
        return
    if value.traced:
        raise MplError("a traced value is saved inside its own @mp.function trace only")
    ctx = value._ctx or current()
    ctx.flush()
    if ctx.client.seal is not None:  # secure: the workers save on this driver's sealed word
        b = GraphBuilder(ctx.cluster.world_size, name="save")
        held = b.input(value.parties)
        b.op(
            "save",
            [held],
            ranks=value.parties,
            nout=0,
            symbol=name,
            persist=persist,
            device=value.device or "",
        )
        ctx.run(b.build([]), {rank: [value._uri] for rank in value.parties})
        return
    info = SymbolInfo(name, value.device or "", value.parties, persist, {"meta": value._meta})
    ctx.client.save_symbol(ctx.session, value._uri, info)


def load(name: str, parties: int | str | Sequence[int | str] | None = None) -> Value:
    """The value saved as ``name``: the session's own, else a persisted one.

    Persisted names belong to the parties that wrote them (each party's own namespace).
    ``parties`` (ranks, or PPU device names) says whose; without it, every party holding
    ``name`` must hold one value (an SPU value's shares, a multi-party value), else the
    load is refused naming the parties. Several parties given explicitly make one
    party-level Value spanning them.

    Inside ``@mp.function`` the load is an op of the function's one job: each party reads
    its own value (the session's, else its persisted file) when the job runs, and a
    missing name fails the job with a ``RemoteError`` naming the op. Which parties read
    it is settled when the function is traced, without a request when it can be: a name
    saved earlier in the same function is read where it was saved; ``parties=`` naming
    one rank or one device is read there (an SPU device: its shares on its members);
    otherwise the broker's table is asked once, at trace time, as outside a function.
    Runs of the traced function send nothing besides their job.
    """
    rec = active()
    if rec is not None:
        return _traced_load(rec, name, parties)
    ctx = current()
    ranks = _ranks(ctx.cluster, parties)
    info = ctx.client.load_symbol(ctx.session, name, parties=ranks)
    held, device = _holders(ctx.cluster, info)
    if device is None and len(held) == 1:
        device = ctx.cluster.ppu_of(held[0])
    return Value(
        device,
        held,
        ctx=ctx,
        uri=f"sym:{name}",
        owned=False,
        meta=str(info.meta.get("meta", "")),
    )


def _traced_load(
    rec: Recorder, name: str, parties: int | str | Sequence[int | str] | None
) -> Value:
    """``mp.load`` in a trace: a ``load`` op on the parties settled now (see :func:`load`)."""
    ranks = _ranks(rec.cluster, parties)
    if name in rec.saved_here:
        held, device = rec.saved_here[name]
        if not ranks or set(ranks) == set(held):
            return rec.traced_value(rec.load(name, held, device), device)
    device = _one_device(rec.cluster, parties)
    if device is not None:
        held = rec.cluster.ranks(device)
    else:  # several parties or none said: the broker's table knows who holds the name
        ctx = current()
        info = ctx.client.load_symbol(ctx.session, name, parties=ranks)
        held, device = _holders(rec.cluster, info)
        if device is None and len(held) == 1:
            device = rec.cluster.ppu_of(held[0])
    return rec.traced_value(rec.load(name, tuple(sorted(held)), device), device)


def _holders(cluster: ClusterSpec, info: SymbolInfo) -> tuple[tuple[int, ...], str | None]:
    """The ranks and device the broker says hold a name, checked against the cluster: a
    broker is not trusted to name only ranks and devices there are (a rank outside the
    world would be taken for another's slot, or fail with an IndexError when fetched)."""
    ranks = info.ranks
    world = cluster.world_size
    if (
        not ranks
        or len(set(ranks)) != len(ranks)
        or not all(type(r) is int and 0 <= r < world for r in ranks)
    ):
        raise ProtocolError(
            f"the broker says {info.name!r} is held by ranks {list(ranks)!r}, "
            f"not distinct ranks of this cluster's {world}"
        )
    device = info.device or None
    if device is not None and device not in cluster.devices:
        raise ProtocolError(f"the broker says {info.name!r} is on {device!r}, no device here")
    return tuple(ranks), device


def _one_device(
    cluster: ClusterSpec, parties: int | str | Sequence[int | str] | None
) -> str | None:
    """The device ``parties`` names when it names exactly one rank's PPU or one device."""
    items = [parties] if isinstance(parties, (int, str)) else list(parties or ())
    if len(items) != 1:
        return None
    item = items[0]
    if isinstance(item, str):
        cluster.device(item)  # KeyError listing the devices when there is no such one
        return item
    return cluster.ppu_of(item)


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
            if ctx.client.seal is not None:
                _unsave_sealed(ctx, item, ranks)
            ctx.client.delete_symbol(ctx.session, item, parties=ranks)
    ctx.flush()


def _unsave_sealed(ctx: Context, name: str, ranks: tuple[int, ...]) -> None:
    """Secure mode: if ``name`` is persisted, its holders (among ``ranks``, if given) delete
    their files by a sealed job first: a worker deletes a file only on its owner's word."""
    info = ctx.client.load_symbol(ctx.session, name, parties=ranks)
    if not info.persist:
        return
    held, _ = _holders(ctx.cluster, info)
    held = tuple(sorted(r for r in held if not ranks or r in ranks))
    if held:
        b = GraphBuilder(ctx.cluster.world_size, name="delete")
        b.op("unsave", [], ranks=held, nout=0, symbol=name)
        ctx.run(b.build([]), {})
