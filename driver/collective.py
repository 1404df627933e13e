"""``mp.collective``: common data movements, written with ``simp.shuffle`` and ``converge``.

Each raises ``ValueError`` when its input is not placed as it needs (for example more than
one source party where one is required).
"""

from __future__ import annotations

from collections.abc import Sequence

from mpl.driver import simp
from mpl.driver.values import Value

__all__ = ["allreplicate", "collect", "distribute", "permute", "replicate", "transfer"]


def _single(x: Value, what: str) -> int:
    if not isinstance(x, Value):
        raise TypeError(f"{what} moves a Value, got {type(x).__name__}")
    if len(x.parties) != 1:
        raise ValueError(f"{what} needs a value held by one party, got parties {x.parties}")
    return x.parties[0]


def transfer(x: Value, *, to: int) -> Value:
    """Move a single-party value to party ``to`` (no-op if it is there already)."""
    source = _single(x, "transfer")
    return x if source == to else simp.shuffle(x, {to: source})


def replicate(x: Value, *, to: Sequence[int]) -> Value:
    """Copy a single-party value to every party in ``to``."""
    source = _single(x, "replicate")
    if not to:
        raise ValueError("replicate needs at least one target party")
    return simp.shuffle(x, {t: source for t in to})


def distribute(values: Sequence[Value], *, frm: int) -> Value:
    """Party ``frm`` holds ``values``; afterwards party i holds ``values[i]``."""
    if not values:
        raise ValueError("distribute needs a non-empty list of values")
    for v in values:
        if _single(v, "distribute") != frm:
            raise ValueError(
                f"distribute: every value must be held by party {frm}, got {v.parties}"
            )
    return simp.converge(*[simp.shuffle(v, {i: frm}) for i, v in enumerate(values)])


def collect(x: Value, *, to: int) -> list[Value]:
    """Gather each party's piece of ``x`` at ``to``: a list in source order."""
    if not isinstance(x, Value):
        raise TypeError(f"collect moves a Value, got {type(x).__name__}")
    return [simp.shuffle(x, {to: s}) for s in x.parties]


def allreplicate(x: Value) -> list[Value]:
    """Every party of ``x`` gets every other party's piece: one value per source."""
    if not isinstance(x, Value):
        raise TypeError(f"allreplicate moves a Value, got {type(x).__name__}")
    return [simp.shuffle(x, {p: s for p in x.parties}) for s in x.parties]


def permute(x: Value, mapping: dict[int, int]) -> Value:
    """Route ``x`` by ``mapping`` ({dst: src}), e.g. {0: 1, 1: 0} swaps two parties."""
    return simp.shuffle(x, mapping)
