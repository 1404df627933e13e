"""The SPU dtype matrix: mpl against spu's own simulator (``spu.utils.simulation.sim_jax``).

Run by tests/test_spu_dtypes.py in a child process with JAX's 64-bit mode off, the mode in
which JAX's rules change dtypes (float64 -> float32, int64 -> int32), and in-process with it
on. Prints one line per mismatch and a summary line ``matrix: N cases, M mismatches, T s``.

    python tests/spu_matrix.py
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

DTYPES = ("bool", "int32", "int64", "float32", "float64")
PROTOCOLS = ((2, "SEMI2K", "FM128"), (3, "ABY3", "FM64"))


def _ops() -> dict[str, Callable[..., Any]]:
    import jax.numpy as jnp

    return {
        "sum": lambda u, v: u.sum(),
        "max": lambda u, v: u.max(),
        "argmax": lambda u, v: jnp.argmax(u),
        "less": lambda u, v: u < v,
        "matmul": lambda u, v: u @ v.T,
        "where": lambda u, v: jnp.where(u > v, u, v),
        "sort": lambda u, v: jnp.sort(u, axis=-1),
    }


def inputs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    # Distinct values (no ties for argmax/sort), small enough for every field and dtype.
    u = np.array([[3, -1, 4, 0], [5, -2, 6, 2]]) / (4 if "float" in dtype else 1)
    v = np.array([[2, 7, -1, 0], [1, 8, -3, 9]]) / (4 if "float" in dtype else 1)
    if dtype == "bool":
        return u > 0, v > 0
    return u.astype(dtype), v.astype(dtype)


def _outcome(call: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", np.asarray(call(*args))
    except Exception as exc:  # the matrix compares failures too: both must fail alike
        return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def _same(mine: tuple[str, Any], theirs: tuple[str, Any]) -> bool:
    if mine[0] != theirs[0]:
        return False
    if mine[0] == "error":
        return True
    a, b = mine[1], theirs[1]
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.allclose(a, b, atol=1e-3))
    return bool(np.array_equal(a, b))


def run() -> tuple[int, list[str]]:
    import spu.libspu as libspu
    import spu.utils.simulation as spusim

    import mpl.driver as mp

    ops = _ops()
    cases, mismatches = 0, []
    for world, protocol, field in PROTOCOLS:
        reference = spusim.Simulator.simple(
            world, getattr(libspu.ProtocolKind, protocol), getattr(libspu.FieldType, field)
        )
        sim = mp.Simulator.simple(world, spu_protocol=protocol, spu_field=field, timeout=120)
        try:
            with sim:
                for dtype in DTYPES:
                    u, v = inputs(dtype)
                    pu, pv = mp.put("P0", u), mp.put("P1", v)  # each sealed by its owner
                    for name, op in ops.items():
                        cases += 1
                        mine = _outcome(_mpl, mp, op, pu, pv)
                        theirs = _outcome(_sim_jax, spusim, reference, op, u, v)
                        if not _same(mine, theirs):
                            mismatches.append(
                                f"{protocol} {dtype} {name}: mpl {_show(mine)} "
                                f"!= spu {_show(theirs)}"
                            )
        finally:
            sim.close()
    return cases, mismatches


def _mpl(mp: Any, op: Callable[..., Any], pu: Any, pv: Any) -> Any:
    return mp.fetch(mp.device("SP0")(op)(pu, pv))


def _sim_jax(spusim: Any, reference: Any, op: Callable[..., Any], u: Any, v: Any) -> Any:
    # sim_jax calls a jax helper that warns about itself; the suite turns warnings into errors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return spusim.sim_jax(reference, op)(u, v)


def _show(outcome: tuple[str, Any]) -> str:
    kind, value = outcome
    if kind == "error":
        return str(value)
    return f"{value.dtype}{list(value.shape)} {value.tolist()}"


if __name__ == "__main__":
    start = time.perf_counter()
    n, bad = run()
    for line in bad:
        print(line)
    print(f"matrix: {n} cases, {len(bad)} mismatches, {time.perf_counter() - start:.1f} s")
    sys.exit(1 if bad else 0)
