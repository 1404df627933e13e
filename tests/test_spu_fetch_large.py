"""An SPU value whose shares exceed the codec's inline size (1 KiB) reaches the driver
from a Simulator, whose in-process broker has imported the share record's module."""

from __future__ import annotations

import numpy as np
import pytest

import mpl.driver as mp

pytestmark = pytest.mark.spu


def test_fetching_an_spu_value_with_large_shares_from_a_simulator() -> None:
    sim = mp.Simulator.simple(2, timeout=30)
    try:
        with sim:
            x = mp.put("P0", np.arange(200.0))  # 200 x 8 bytes per FM64 share: > 1 KiB
            doubled = mp.device("SP0")(lambda v: v * 2)(x)
            np.testing.assert_allclose(mp.fetch(doubled), np.arange(200.0) * 2, atol=1e-3)
    finally:
        sim.close()
