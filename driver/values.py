"""``mp.Value``: a reference to data held by workers, never the data itself.

A Value knows its device (``"P0"``, ``"SP0"``, or ``None`` for a multi-party value made with
``mp.simp``), the ranks holding it, and where they store it. Inside ``@mp.function`` tracing
the same class stands for a value of the graph being built. When a concrete Value is
garbage-collected, its context frees the workers' copies (deletes are batched).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpl.wire.printable import one_line

if TYPE_CHECKING:
    from mpl.driver.context import Context
    from mpl.driver.recorder import Recorder

__all__ = ["NOT_CACHED", "Value", "output_value"]


class _NotCached:
    def __repr__(self) -> str:
        return "NOT_CACHED"


NOT_CACHED: Any = _NotCached()


class Value:
    """Data on a device. Pass it to device functions, ``mp.put``, ``mp.fetch``; index it."""

    __slots__ = (
        "__weakref__",
        "_cache",
        "_ctx",
        "_meta",
        "_owned",
        "_recorder",
        "_sym",
        "_uri",
        "device",
        "parties",
    )

    def __init__(
        self,
        device: str | None,
        parties: tuple[int, ...],
        *,
        ctx: Context | None = None,
        uri: str = "",
        owned: bool = False,
        cache: dict[int, Any] | None = None,
        meta: str = "",
        recorder: Recorder | None = None,
        sym: int = -1,
    ) -> None:
        self.device = device
        self.parties = parties
        self._ctx = ctx
        self._uri = uri
        self._owned = owned
        self._cache = cache or {}
        self._meta = meta
        self._recorder = recorder
        self._sym = sym

    @property
    def traced(self) -> bool:
        """True for a value of a graph being traced (inside ``@mp.function``)."""
        return self._recorder is not None

    def cached(self, rank: int) -> Any:
        """The value held by ``rank`` if it came back with the job, else ``NOT_CACHED``."""
        return self._cache.get(rank, NOT_CACHED)

    def __getitem__(self, key: Any) -> Value:
        from mpl.driver.devices import getitem

        return getitem(self, key)

    def __repr__(self) -> str:
        where = ",".join(str(r) for r in self.parties)
        # the description is a worker's word, relayed by the broker: escaped, one line
        what = f", {one_line(self._meta)}" if self._meta else ""
        state = " traced" if self.traced else ""
        return f"Value({self.device or 'simp'} @{where}{what}{state})"

    def __bool__(self) -> bool:
        raise TypeError(
            "a Value has no truth value on the driver (its data lives on the workers); "
            "use mp.fetch(v) to bring it here first"
        )

    def __reduce__(self) -> Any:
        raise TypeError(
            "a Value cannot be sent inside other data; pass it as a direct argument to the "
            "device function (or inside a list, tuple or dict)"
        )

    def __del__(self) -> None:
        ctx = self._ctx
        if self._owned and ctx is not None and not ctx.closed:
            ctx._released.append((self.parties, self._uri))  # ctx.release, written out


_new = object.__new__
_FIELDS = ("_cache", "_ctx", "_meta", "_owned", "_recorder", "_sym", "_uri", "device", "parties")
assert tuple(sorted(set(Value.__slots__) - {"__weakref__"})) == _FIELDS  # output_value sets each


def output_value(
    device: str | None,
    parties: tuple[int, ...],
    ctx: Context,
    uri: str,
    cache: dict[int, Any] | None,
    meta: str,
) -> Value:
    """``Value(device, parties, ctx=ctx, uri=uri, owned=True, cache=cache, meta=meta)``: a
    finished job's output, one per output per job, its slots filled without ``__init__``'s
    keyword matching (about half the instructions of the call)."""
    value = _new(Value)
    value.device = device
    value.parties = parties
    value._ctx = ctx
    value._uri = uri
    value._owned = True
    value._cache = cache or {}
    value._meta = meta
    value._recorder = None
    value._sym = -1
    return value
