"""What a job's outputs look like from outside: a short description, and whether a value is
small enough to ride back inside ``Done``."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["INLINE_BYTES", "SCALAR_NAMES", "describe", "is_small"]

INLINE_BYTES = 64 * 1024  # outputs up to this size ride back inside Done


# Built-in types describe themselves by name: no numpy check, no mpl_describe to look up
# (their instances take no attributes). Most job outputs are one of these.
_BUILTIN_NAMES: dict[type, str] = {
    t: t.__name__ for t in (int, float, bool, str, bytes, list, dict, tuple, type(None))
}


def describe(value: Any) -> str:
    """A short description of a value for ``repr(Value)``: ``float64[3, 2]``, ``int``, ..."""
    name = _BUILTIN_NAMES.get(type(value))
    if name is not None:
        return name
    np = sys.modules.get("numpy")  # no numpy loaded: no numpy values to describe
    if np is not None and isinstance(value, np.ndarray):
        return f"{value.dtype}[{', '.join(map(str, value.shape))}]"
    if np is not None and isinstance(value, np.generic):
        return str(value.dtype)
    describe_self = getattr(value, "mpl_describe", None)
    if callable(describe_self):
        return str(describe_self())
    return type(value).__name__


# The scalars a job returns most: what describe says of each; each is small (16 in _size).
# The job shell checks this table first, so such an output costs it no call.
SCALAR_NAMES: dict[type, str] = {t: t.__name__ for t in (int, float, bool, type(None))}


def is_small(value: Any, budget: int = INLINE_BYTES) -> bool:
    """Cheap bound on the encoded size: only plain data qualifies for inline return."""
    return _size(value, budget, 0) <= budget


def _size(value: Any, budget: int, depth: int) -> int:
    t = type(value)
    np = sys.modules.get("numpy")
    if (
        value is None
        or t in (bool, int, float)
        or (np is not None and isinstance(value, np.generic))
    ):
        return 16
    if t in (str, bytes):
        return len(value) + 8
    if np is not None and t is np.ndarray:
        return int(value.nbytes) + 64 if not value.dtype.hasobject else budget + 1
    if t in (list, tuple) and depth < 4 and len(value) <= 256:
        total = 8
        for item in value:
            total += _size(item, budget, depth + 1)
            if total > budget:
                break
        return total
    if t is dict and depth < 4 and len(value) <= 256:
        total = 8
        for k, v in value.items():
            total += _size(k, budget, depth + 1) + _size(v, budget, depth + 1)
            if total > budget:
                break
        return total
    return budget + 1
