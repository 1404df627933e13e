"""``mpl-worker --code kernels``: run named kernels and built-in ops, never shipped code.

Under this policy every message (from the broker or a peer) is first decoded with pickles
left opaque (:class:`mpl.wire.codec.Pickled`), and one that holds any pickle is refused
before anything in it is unpickled: unpickling is where shipped code would run. A refused
peer move fails its job at once. What still works is what
travels without pickles: ``mp.kernel`` calls (a name, resolved to the operator's installed
kernels), moves, SPU seal and reveal, constants, and arrays, numbers and strings as inputs.
``spu.run`` carries a pickled JAX function, so it is refused too. A program is checked as a
whole, without unpickling any of it: one that ships a pickled function for another party is
refused here as well, so keep such a party's part of a program to kernels and built-in ops.

A refused program is remembered (boundedly) by digest, and every job that runs it fails
with a ``RemotePermissionError`` (a ``RemoteError`` that is also a ``PermissionError``).
"""

from __future__ import annotations

from typing import Any

from mpl.wire.codec import Pickled
from mpl.wire.record import Record, record_fields

__all__ = ["CODE_POLICIES", "REFUSAL", "holds_pickle"]

CODE_POLICIES = ("any", "kernels")
REFUSAL = (
    "this worker runs only named kernels and built-in ops (mpl-worker --code kernels): "
    "it refused {what}, which carries pickled code or objects, without unpickling it; "
    "call an installed kernel with mp.kernel(name) instead"
)
_MAX_DEPTH = 64


def holds_pickle(value: Any, depth: int = 0) -> bool:
    """True if a message decoded with ``unpickle=False`` holds a pickled value anywhere."""
    if isinstance(value, Pickled):
        return True
    if depth > _MAX_DEPTH:  # absurdly deep: refuse rather than recurse further
        return True
    if isinstance(value, Record):
        return any(holds_pickle(v, depth + 1) for v in record_fields(value))
    if isinstance(value, (list, tuple)):
        return any(holds_pickle(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(
            holds_pickle(k, depth + 1) or holds_pickle(v, depth + 1) for k, v in value.items()
        )
    return False
