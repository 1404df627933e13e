"""spu's compile cache stays sound when several threads of one process compile at once.

``spu.api.compile`` memoises in a process-wide LRU cache without a lock (see
``mpl/wire/spu_compile_cache.py``); mpl's Simulator members and a driver's own spu code
share it. Once spu is loaded through mpl, hammering it from threads must raise nothing;
without the guard this fails with ``OrderedDict mutated during iteration`` or ``KeyError``.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

import pytest

pytestmark = pytest.mark.spu

_SOURCES = 136  # just over the cache's 128 entries: mostly hits, and evictions all along
_CALLS = 2500  # per thread


def _sources(lib: Any) -> list[Any]:
    import jax
    import numpy as np
    import spu.utils.frontend as fe

    out = []
    for n in range(1, _SOURCES + 1):
        spec = jax.ShapeDtypeStruct((n,), np.float32)  # type: ignore[no-untyped-call]  # jax's
        ir, _ = fe._jax_compilation(lambda x: x + 1, (), None, [spec], {})
        out.append(lib.CompilationSource(lib.SourceIRType.XLA, ir, [lib.Visibility.VIS_SECRET]))
    return out


def test_spu_compile_cache_survives_threads() -> None:
    import spu.api as api

    from mpl.wire.shares import libspu

    lib = libspu()  # how every mpl process loads spu
    sources, options = _sources(lib), lib.CompilerOptions()
    errors: list[str] = []

    def hammer(seed: int) -> None:
        picks = random.Random(seed)  # random order keeps most calls hits
        for _ in range(_CALLS):
            try:
                api.compile(sources[picks.randrange(len(sources))], options)
            except Exception as exc:  # what a torn cache raises
                errors.append(f"{type(exc).__name__}: {exc}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the race shows in seconds
    try:
        threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [], f"{len(errors)} failed calls, first: {errors[0]}"
