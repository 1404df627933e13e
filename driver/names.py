"""Named values: ``mp.save``, ``mp.load``, ``mp.delete``.

A name lives in the session (any driver attached to it can load it) or, with
``persist=True``, on the disks of the workers holding the value, where it outlives the
session and restarts and any later session can load it.
"""

from __future__ import annotations

from mpl.driver.context import current
from mpl.driver.recorder import active
from mpl.driver.values import Value
from mpl.wire.errors import MplError
from mpl.wire.sessions import SymbolInfo

__all__ = ["delete", "load", "save"]


def save(value: Value, name: str, *, persist: bool = False) -> None:
    """Name ``value`` in the session; ``persist=True`` also writes it to the workers' disks."""
    if active() is not None or value.traced:
        raise MplError("mp.save runs outside @mp.function: save what the function returns")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a name must be a non-empty string, got {name!r}")
    ctx = value._ctx or current()
    ctx.flush()
    info = SymbolInfo(name, value.device or "", value.parties, persist, {"meta": value._meta})
    ctx.client.save_symbol(ctx.session, value._uri, info)


def load(name: str) -> Value:
    """The value saved as ``name`` (in this session, or persisted by any session)."""
    ctx = current()
    info = ctx.client.load_symbol(ctx.session, name)
    return Value(
        info.device or None,
        info.ranks,
        ctx=ctx,
        uri=f"sym:{name}",
        owned=False,
        meta=str(info.meta.get("meta", "")),
    )


def delete(*items: str | Value) -> None:
    """Forget names (and their files when persisted), or free Values now."""
    ctx = current()
    for item in items:
        if isinstance(item, Value):
            if item._owned and item._ctx is not None:
                item._owned = False
                item._ctx.release(item.parties, item._uri)
        else:
            ctx.client.delete_symbol(ctx.session, item)
    ctx.flush()
