"""Persisted names, per party: which rank holds a file for which name.

A value saved with ``persist=True`` is written by each rank that holds it, on that rank's
own disk. Two parties may each persist ``model``: they are two entries, ``("model", 0)``
and ``("model", 1)``, and neither overwrites nor hides the other. The table is what the
workers say they hold: a worker's hello (on every registration, so also after a broker
restart) replaces every entry of its rank, and a save or delete acknowledged by a rank
changes that rank's entries only.

Resolving a name for ``mp.load(name, parties=...)``: the entries of the asked ranks (all
holders when none are asked) must form one value: an SPU value whose shares are all
there, or one multi-party value, or, when ranks are asked for explicitly, the values of
several parties side by side (a party-level value spanning them). Distinct values of
several parties loaded without saying which is ambiguous and refused, listing them.
"""

from __future__ import annotations

from mpl.wire.limits import MAX_PERSISTED_NAMES, valid_name
from mpl.wire.lru import LRU
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SymbolInfo

__all__ = ["PersistedTable"]


class PersistedTable:
    """``(name, rank) -> SymbolInfo`` for every file the live workers reported."""

    def __init__(self, limit: int = MAX_PERSISTED_NAMES) -> None:
        self.entries: LRU[tuple[str, int], SymbolInfo] = LRU(limit)

    # -- what the workers say ---------------------------------------------------------------
    def replace_rank(self, rank: int, infos: list[SymbolInfo]) -> None:
        """Rank ``rank`` (re)registered and listed what its disk holds now."""
        for key in [k for k in self.entries if k[1] == rank]:
            del self.entries[key]
        for info in infos:
            # names become file names on the workers; a worker speaks for its own rank only
            if valid_name(info.name) and rank in info.ranks:
                self.entries[(info.name, rank)] = info

    def saved(self, info: SymbolInfo, ranks: tuple[int, ...]) -> None:
        for rank in ranks:
            self.entries[(info.name, rank)] = info

    def deleted(self, name: str, ranks: tuple[int, ...]) -> None:
        for rank in ranks:
            self.entries.pop((name, rank), None)

    # -- what drivers ask -------------------------------------------------------------------
    def holders(self, name: str) -> dict[int, SymbolInfo]:
        return {rank: info for (n, rank), info in self.entries.items() if n == name}

    def names(self) -> list[str]:
        return sorted({name for name, _ in self.entries})

    def __contains__(self, name: object) -> bool:
        return any(n == name for n, _ in self.entries)

    def resolve(self, name: str, parties: tuple[int, ...] = ()) -> SymbolInfo | ErrorInfo | None:
        """What ``mp.load(name, parties=parties)`` stands for (``()``: every holder); None
        when no rank holds ``name``; an error when the holders do not make one value."""
        held = self.holders(name)
        if not held:
            return None
        if parties:
            missing = sorted(set(parties) - set(held))
            if missing:
                return _error(
                    f"{name!r} is not persisted on rank(s) {missing}; "
                    f"it is held by {_describe(held)}"
                )
            held = {r: held[r] for r in sorted(set(parties))}
        groups: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        for rank, info in sorted(held.items()):
            groups.setdefault((info.device, tuple(info.ranks)), []).append(rank)
        spu = [key for key in groups if _is_spu(held[groups[key][0]])]
        if spu:
            (device, ranks), present = spu[0], groups[spu[0]]
            if len(groups) > 1 or tuple(present) != ranks:
                return _error(
                    f"{name!r} on {device} is secret-shared over ranks {list(ranks)}: "
                    f"load it from all of them together (held by {_describe(held)})"
                )
            return held[present[0]]
        if len(groups) == 1:
            (device, ranks), present = next(iter(groups.items()))
            first = held[present[0]]
            if tuple(present) == ranks:
                return first
            return SymbolInfo(name, "", tuple(present), True, dict(first.meta))
        if not parties:
            return _error(
                f"{name!r} is persisted by several parties, each with its own value: "
                f"{_describe(held)}; say whose with mp.load({name!r}, parties=(rank,)) "
                "(or several ranks for a value spanning them)"
            )
        return SymbolInfo(name, "", tuple(sorted(held)), True, {})


def _is_spu(info: SymbolInfo) -> bool:
    # a PPU has one member and a party-level value no device: a device over several ranks
    # is an SPU, whose shares only make a value together
    return bool(info.device) and len(info.ranks) > 1


def _describe(held: dict[int, SymbolInfo]) -> str:
    return ", ".join(
        f"rank {rank} ({info.device or 'party value'})" for rank, info in sorted(held.items())
    )


def _error(message: str) -> ErrorInfo:
    return ErrorInfo("SessionError", message)
