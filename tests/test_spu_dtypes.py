"""SPU programs behave as in spu's own simulator: the dtype x op matrix of tests/spu_matrix.py
(SEMI2K 2p and ABY3 3p, one Simulator session per protocol), with JAX's 64-bit mode off
(in a child process: inputs become float32/int32 by JAX's rules) and on (this process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import spu_matrix

HERE = Path(__file__).resolve().parent


@pytest.mark.spu
@pytest.mark.timeout(240)
def test_dtype_matrix_matches_spu_simulator_with_x64_off(tmp_path: Path) -> None:
    env = {**os.environ, "JAX_ENABLE_X64": "0"}
    out = subprocess.run(
        [sys.executable, str(HERE / "spu_matrix.py")],
        capture_output=True,
        text=True,
        timeout=220,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "70 cases, 0 mismatches" in out.stdout


@pytest.mark.spu
@pytest.mark.timeout(240)
def test_dtype_matrix_matches_spu_simulator_with_x64_on() -> None:
    import jax

    # conftest turns 64-bit mode on for the suite (jax's stubs do not list its flags)
    assert jax.config.jax_enable_x64  # type: ignore[attr-defined]  # see above
    cases, mismatches = spu_matrix.run()
    assert cases == 70
    assert mismatches == []
