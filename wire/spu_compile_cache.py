"""spu's compile cache, made safe to use from several threads of one process.

``spu.utils.frontend.compile`` (what an SPU member and ``spu.utils.simulation.sim_jax``
call) traces under spu's own lock, then calls ``spu.api.compile``, whose results are
memoised in a process-wide ``cachetools.LRUCache`` without any lock. Two threads in that
cache at once corrupt its order bookkeeping: ``RuntimeError: OrderedDict mutated during
iteration`` (evicting while another thread inserts) or a spurious ``KeyError``. In an
mpl Simulator every member is a thread, and the driver's own program may use spu too, so
mpl's per-process compile lock alone cannot keep other callers out.

:func:`guard_compile_cache` puts one lock around that memoised function, for every caller
in the process, mpl's or not. Compiles in one process then run one at a time, as mpl's
members already do.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["guard_compile_cache"]

_LOCK = threading.Lock()
_MARK = "_mpl_serialised"


def guard_compile_cache() -> bool:
    """Serialise calls of ``spu.api``'s memoised compile; True when the guard is in place
    (idempotent; False only if this spu build no longer has that function)."""
    import spu.api as api

    memoised: Any = getattr(api, "_spu_compilation", None)
    if memoised is None or not callable(memoised):
        return False
    if getattr(memoised, _MARK, False):
        return True

    def serialised(source: Any, options: Any) -> Any:
        with _LOCK:
            return memoised(source, options)

    setattr(serialised, _MARK, True)
    serialised.__wrapped__ = memoised  # type: ignore[attr-defined]
    api._spu_compilation = serialised
    return True
