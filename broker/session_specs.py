"""Open sessions' own cluster specs, equal ones shared, within one budget over them all.

A session opened with ``cluster=`` keeps its own spec at the broker while it is open (its
named nodes' runtime_info, its devices). Each spec is bounded by the wire's limits, but
drivers may hold ``MAX_SESSIONS`` sessions: their sum is kept within
``MAX_SESSION_SPECS_TOTAL`` (weighed by :func:`mpl.wire.runtime_info.info_weight`).
Sessions opened with equal specs (a driver's sessions over one spec, mostly) share one
copy, counted once, found by its fingerprint (:mod:`mpl.wire.fingerprint`: one hash
lookup); a spec holding anything else than text, numbers, booleans, None, lists and
maps (an array in a device's config, say, which the weight would count as one item) is
refused. On a secure broker each listed driver (the session's owner, by its key) has
its share, counting each copy its sessions use once: a driver near its 256 sessions with
specs near their bounds would otherwise take every other driver's room. The share is of
the smaller of this budget and a worker's over the runtime_info it keeps for its node
(``MAX_RUNTIME_INFO_TOTAL``, which cannot tell whose a session is), over the number of
listed drivers: a spec weighs at least each runtime_info it carries, so every driver's
sessions together stay within each worker's budget, and one driver cannot fill a
worker's room for all others (review w33). An open whose spec does not fit is refused with a
``ClusterSpecError`` saying why; sessions already open keep theirs.

No I/O; the broker's one loop uses it.
"""

from __future__ import annotations

from typing import Any

from mpl.wire.fingerprint import MAX_FINGERPRINT_DEPTH, fingerprint
from mpl.wire.limits import MAX_RUNTIME_INFO_TOTAL, MAX_SESSION_SPECS_TOTAL
from mpl.wire.runtime_info import info_weight

__all__ = ["SessionSpecs"]


class _Spec:
    """One spec kept, and how many open sessions run on it."""

    __slots__ = ("spec", "users", "weight")

    def __init__(self, spec: dict[str, Any], weight: int) -> None:
        self.spec = spec
        self.weight = weight
        self.users = 0


class SessionSpecs:
    """The specs of open sessions: ``keep`` one for a session opening, ``release`` it when
    the session goes."""

    def __init__(self, budget: int = MAX_SESSION_SPECS_TOTAL, *, drivers: int = 0) -> None:
        self.budget = budget
        self.drivers = drivers  # listed drivers, each its share (0: no shares, plaintext)
        self.weight = 0  # of every spec kept (each shared copy once)
        self.refused = 0
        self._kept: dict[object, _Spec] = {}
        self._owned: dict[tuple[str, object], int] = {}  # (owner, copy): its sessions on it
        self._owner_weight: dict[str, int] = {}  # the copies each owner's sessions use

    def keep(self, spec: dict[str, Any], owner: str = "") -> tuple[dict[str, Any], object] | str:
        """The copy a session of ``owner`` opening with ``spec`` keeps, and its key for
        ``release``; or why it does not fit."""
        key = fingerprint(spec)
        if key is None:  # a value info_weight would count as one item, whatever its size
            self.refused += 1
            return (
                "a session's cluster spec holds text, numbers, booleans, None, lists and "
                "maps only, nested at most "
                f"{MAX_FINGERPRINT_DEPTH} deep: it holds a value of another type, or "
                "nests deeper"
            )
        kept = self._kept.get(key)
        weight = kept.weight if kept is not None else info_weight(spec)
        if self.drivers and (owner, key) not in self._owned:
            share = min(self.budget, MAX_RUNTIME_INFO_TOTAL) // self.drivers
            used = self._owner_weight.get(owner, 0)
            if used + weight > share:
                self.refused += 1
                return (
                    f"{owner}'s share of the broker's room for open sessions' own cluster "
                    f"specs is {share} bytes, {used} of which its sessions take: this "
                    f"session's ({weight}) does not fit; close sessions opened with "
                    "cluster=, or open this one with a smaller spec (or none: the broker's "
                    "own)"
                )
        if kept is None:
            if self.weight + weight > self.budget:
                self.refused += 1
                return (
                    f"the broker keeps at most {self.budget} bytes of open sessions' own "
                    f"cluster specs, {self.weight} of which are taken: this session's "
                    f"({weight}) does not fit; close sessions opened with cluster=, or open "
                    "this one with a smaller spec (or none: the broker's own)"
                )
            kept = self._kept[key] = _Spec(spec, weight)
            self.weight += weight
        kept.users += 1
        sessions = self._owned.get((owner, key), 0)
        self._owned[(owner, key)] = sessions + 1
        if not sessions:
            self._owner_weight[owner] = self._owner_weight.get(owner, 0) + weight
        return kept.spec, key

    def release(self, key: object, owner: str = "") -> None:
        """A session of ``owner`` that kept the spec under ``key`` goes."""
        kept = self._kept.get(key)
        if kept is None:
            return
        sessions = self._owned.pop((owner, key), 0) - 1
        if sessions > 0:
            self._owned[(owner, key)] = sessions
        else:
            left = self._owner_weight.pop(owner, 0) - kept.weight
            if left > 0:
                self._owner_weight[owner] = left
        kept.users -= 1
        if not kept.users:
            del self._kept[key]
            self.weight -= kept.weight
