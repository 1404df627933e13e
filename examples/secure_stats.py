"""Secure mean and variance of values held by 3 parties.

Each party holds salaries it may not disclose. The SPU computes the joint mean and
variance on secret shares; only those two numbers are revealed, to P0.

    python examples/secure_stats.py [--url URL | --sim]
"""

from __future__ import annotations

import numpy as np
from _common import cluster

import mpl.driver as mp


def salaries(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(4000 + 500 * seed, 700, size=200)


def mean_and_variance(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[object, object]:
    import jax.numpy as jnp

    # in thousands: fixed-point MPC is most precise for values of order 1
    everything = jnp.concatenate([a, b, c]) / 1000.0
    mean = everything.mean()
    return mean * 1000.0, ((everything - mean) ** 2).mean() * 1e6


@mp.function
def joint_stats() -> tuple[mp.Value, mp.Value]:
    parts = [mp.device(f"P{r}")(salaries)(r) for r in range(3)]
    mean, var = mp.device("SP0", nout=2)(mean_and_variance)(*parts)
    return mp.put("P0", mean), mp.put("P0", var)


if __name__ == "__main__":
    with cluster(__doc__.splitlines()[0], 3):
        mean, var = (float(v) for v in mp.fetch(list(joint_stats())))
        plain = np.concatenate([salaries(r) for r in range(3)])
        print(f"MPC:       mean {mean:10.3f}   variance {var:12.3f}")
        print(f"plaintext: mean {plain.mean():10.3f}   variance {plain.var():12.3f}")
        assert abs(mean - plain.mean()) < 1e-3 * abs(plain.mean())
        assert abs(var - plain.var()) < 1e-2 * plain.var()
