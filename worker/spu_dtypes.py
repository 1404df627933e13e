"""SPU inputs in the dtypes JAX's rules give them, as ``spu.utils.simulation`` does.

spu's own simulator feeds every input through ``jnp.array`` first, so a program sees the
dtypes of JAX's current mode: with 64-bit mode off (``JAX_ENABLE_X64`` unset), float64 and
int64 inputs become float32 and int32. A share, though, keeps the dtype of the array it was
made from, on whichever machine made it. Compiling for the canonical dtype and then feeding
a 64-bit share fails inside libspu (``Enforce fail ... a.dtype() == b.dtype()``).

So a member compiles each SPU program for the shares' actual dtypes and, where JAX's rules
of this process say otherwise, converts the inputs to the canonical dtype under MPC as the
program's first step, then traces the user's function in this process's own JAX mode. The
function therefore sees exactly what spu's simulator would give it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["canonical_dtypes", "compile_scope", "with_canonical_inputs"]


def canonical_dtypes(dtypes: Sequence[str]) -> tuple[str, ...]:
    """The dtype each input has once JAX's rules of this process are applied."""
    import jax
    import numpy as np

    return tuple(str(np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(d)))) for d in dtypes)


@contextlib.contextmanager
def compile_scope(actual: Sequence[str], canonical: Sequence[str]) -> Iterator[None]:
    """Where to trace a program whose inputs arrive as ``actual`` dtypes: JAX's 64-bit mode
    on (on this thread only) when some input is wider than JAX's rules allow, so the
    program's signature can name the share's real dtype."""
    if tuple(actual) == tuple(canonical):
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def with_canonical_inputs(
    fn: Callable[..., Any], actual: Sequence[str], canonical: Sequence[str]
) -> Callable[..., Any]:
    """``fn`` preceded by a conversion of each input to its canonical dtype; ``fn`` itself is
    traced in this process's own JAX mode, as spu's simulator would trace it."""
    if tuple(actual) == tuple(canonical):
        return fn
    import jax
    import numpy as np

    # This process's own mode, read before compile_scope turns 64-bit mode on.
    outer_x64 = bool(jax.dtypes.canonicalize_dtype(np.float64) == np.float64)

    def converted(*xs: Any) -> Any:
        cast = [x if a == c else x.astype(c) for x, a, c in zip(xs, actual, canonical, strict=True)]
        with jax.enable_x64(outer_x64):
            return fn(*cast)

    return converted
