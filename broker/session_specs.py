"""Open sessions' own cluster specs, equal ones shared, within one budget over them all.

A session opened with ``cluster=`` keeps its own spec at the broker while it is open (its
named nodes' runtime_info, its devices). Each spec is bounded by the wire's limits, but
drivers may hold ``MAX_SESSIONS`` sessions: their sum is kept within
``MAX_SESSION_SPECS_TOTAL`` (weighed by :func:`mpl.wire.runtime_info.info_weight`).
Sessions opened with equal specs (a driver's sessions over one spec, mostly) share one
copy, counted once, found by its fingerprint (:mod:`mpl.wire.fingerprint`: one hash
lookup). An open whose spec does not fit is refused with a ``ClusterSpecError`` saying
why; sessions already open keep theirs.

No I/O; the broker's one loop uses it.
"""

from __future__ import annotations

from typing import Any

from mpl.wire.fingerprint import fingerprint
from mpl.wire.limits import MAX_SESSION_SPECS_TOTAL
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

    def __init__(self, budget: int = MAX_SESSION_SPECS_TOTAL) -> None:
        self.budget = budget
        self.weight = 0  # of every spec kept (each shared copy once)
        self.refused = 0
        self._kept: dict[object, _Spec] = {}

    def keep(self, spec: dict[str, Any]) -> tuple[dict[str, Any], object] | str:
        """The copy a session opening with ``spec`` keeps, and its key for ``release``; or
        why it does not fit."""
        key: object = fingerprint(spec)
        kept = self._kept.get(key) if key is not None else None
        if kept is None:
            weight = info_weight(spec)
            if self.weight + weight > self.budget:
                self.refused += 1
                return (
                    f"the broker keeps at most {self.budget} bytes of open sessions' own "
                    f"cluster specs, {self.weight} of which are taken: this session's "
                    f"({weight}) does not fit; close sessions opened with cluster=, or open "
                    "this one with a smaller spec (or none: the broker's own)"
                )
            if key is None:  # a value the fingerprint does not cover: kept unshared
                key = object()
            kept = self._kept[key] = _Spec(spec, weight)
            self.weight += weight
        kept.users += 1
        return kept.spec, key

    def release(self, key: object) -> None:
        """A session that kept the spec under ``key`` goes."""
        kept = self._kept.get(key)
        if kept is None:
            return
        kept.users -= 1
        if not kept.users:
            del self._kept[key]
            self.weight -= kept.weight
