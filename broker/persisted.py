"""Persisted names, per party: which rank holds a file for which name.

A value saved with ``persist=True`` is written by each rank that holds it, on that rank's
own disk. Two parties may each persist ``model``: they are two entries, ``("model", 0)``
and ``("model", 1)``, and neither overwrites nor hides the other. The table is what the
workers say they hold: a worker's hello (on every registration, so also after a broker
restart) replaces every entry of its rank, and a save or delete acknowledged by a rank
changes that rank's entries only.

Who may list a name (secure mode): each entry keeps its owner, the driver whose sealed job
saved it. For a save the broker saw done it is that job's authenticated sender (never a
field anyone wrote); for what a worker's hello lists (after a broker restart, say) it is
that worker's word about the files on its own disk, which it wrote the owners into (``""``:
none recorded, or not a driver of the broker's spec). A value held by several ranks (an
SPU value's shares, a multi-party value: the entries of one name with the same device and
ranks) is listed to its owner only when every rank holding it names the same owner, else
to no one: one rank cannot show another driver a name the other ranks hold for its owner.
A hostile party's worker can only misreport the owners of the names on its own disk (it
knows those names anyway), so it can hide them from their owner or show them to another
driver, but no name another rank holds. Plaintext mode authenticates no one: every entry
is listed to every driver, as before.

Resolving a name for ``mp.load(name, parties=...)``: the entries of the asked ranks (all
holders when none are asked) must form one value: an SPU value whose shares are all
there, or one multi-party value, or, when ranks are asked for explicitly, the values of
several parties side by side (a party-level value spanning them). Distinct values of
several parties loaded without saying which is ambiguous and refused, listing them.
In secure mode a load resolves only among the values the loading session's owner owns
(listed to it as above), as a worker reads a persisted value only in its owner's
sessions: a name persisted by another driver, or of no known owner, answers exactly as a
name that does not exist: a load (or delete) of a guessed name tells a driver nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpl.wire.limits import MAX_PERSISTED_NAMES, valid_name
from mpl.wire.lru import LRU
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SymbolInfo

__all__ = ["PersistedTable"]


class PersistedTable:
    """``(name, rank) -> (SymbolInfo, owner)`` for every file the live workers reported
    (owner ``""``: no one known)."""

    def __init__(self, limit: int = MAX_PERSISTED_NAMES) -> None:
        self.entries: LRU[tuple[str, int], tuple[SymbolInfo, str]] = LRU(limit)

    # -- what the workers say ---------------------------------------------------------------
    def replace_rank(
        self, rank: int, infos: list[SymbolInfo], owners: Mapping[str, str] | None = None
    ) -> None:
        """Rank ``rank`` (re)registered and listed what its disk holds now, and (``owners``,
        name -> owner, already checked by the caller) whose each file is."""
        for key in [k for k in self.entries if k[1] == rank]:
            del self.entries[key]
        owners = owners or {}
        for info in infos:
            # names become file names on the workers; a worker speaks for its own rank only
            if valid_name(info.name) and rank in info.ranks:
                self.entries[(info.name, rank)] = (info, owners.get(info.name, ""))

    def saved(self, info: SymbolInfo, ranks: tuple[int, ...], owner: str = "") -> None:
        """Ranks ``ranks`` wrote ``info.name`` for ``owner`` (the authenticated driver of
        the job that saved it; ``""``: no one known, listed to no one in secure mode)."""
        for rank in ranks:
            self.entries[(info.name, rank)] = (info, owner)

    def deleted(self, name: str, ranks: tuple[int, ...]) -> None:
        for rank in ranks:
            self.entries.pop((name, rank), None)

    # -- what drivers ask -------------------------------------------------------------------
    def holders(self, name: str, owner: str | None = None) -> dict[int, SymbolInfo]:
        """The ranks holding ``name``: all of them for ``owner`` None (plaintext), else those
        holding a value ``owner`` owns (every rank holding it agreeing), as listed to it."""
        held = {rank: entry for (n, rank), entry in self.entries.items() if n == name}
        if owner is None:
            return {rank: info for rank, (info, _) in held.items()}
        owners = _value_owners(held)
        return {
            rank: info
            for rank, (info, _) in held.items()
            if owner and owners[_value(info)] == owner
        }

    def names(self, viewer: str | None = None) -> list[str]:
        """Every persisted name (``viewer`` None: plaintext), or those ``viewer`` may list."""
        if viewer is None:
            return sorted({name for name, _ in self.entries})
        return sorted({name for name, _, _ in self.listed(viewer)})

    def listed(self, viewer: str | None) -> list[tuple[str, int, SymbolInfo]]:
        """``(name, rank, info)`` by name and rank: every entry for ``viewer`` None (plaintext),
        else the entries of the values ``viewer`` owns (every rank holding one agreeing)."""
        by_name: dict[str, dict[int, tuple[SymbolInfo, str]]] = {}
        for (name, rank), entry in self.entries.items():
            by_name.setdefault(name, {})[rank] = entry
        rows: list[tuple[str, int, SymbolInfo]] = []
        for name in sorted(by_name):
            held = by_name[name]
            owners = _value_owners(held) if viewer is not None else {}
            for rank, (info, _) in sorted(held.items()):
                if viewer is None or (viewer and owners[_value(info)] == viewer):
                    rows.append((name, rank, info))
        return rows

    def __contains__(self, name: object) -> bool:
        return any(n == name for n, _ in self.entries)

    def resolve(
        self, name: str, parties: tuple[int, ...] = (), owner: str | None = None
    ) -> SymbolInfo | ErrorInfo | None:
        """What ``mp.load(name, parties=parties)`` stands for (``()``: every holder); None
        when no rank holds ``name``; an error when the holders do not make one value.

        ``owner`` (secure mode: the owner of the loading session) sees only the entries
        :meth:`holders` gives it, so another driver's name, or one of no known owner,
        resolves as a name no rank holds: no error names its ranks or device."""
        held = self.holders(name, owner)
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


def _value(info: SymbolInfo) -> tuple[str, tuple[int, ...]]:
    """Which value of its name an entry is part of: the same device and ranks are one."""
    return info.device, tuple(info.ranks)


def _value_owners(
    held: dict[int, tuple[SymbolInfo, str]],
) -> dict[tuple[str, tuple[int, ...]], str]:
    """The owner of each value among one name's entries, ``""`` when the ranks holding it
    do not all name the same one."""
    owners: dict[tuple[str, tuple[int, ...]], str] = {}
    for info, owner in held.values():
        key = _value(info)
        owners[key] = owner if owners.get(key, owner) == owner else ""
    return owners


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
