"""A few steps of logistic regression on vertically split data.

P0 holds 3 features of each customer, P1 holds 2 other features and the labels. The model
is trained under MPC on SP0: the features and labels are secret-shared, gradient steps run
on shares, and only the final weights are revealed (to P1). The MPC weights are printed next
to those of the same steps in plaintext numpy.

    python examples/logistic_regression.py [--url URL | --sim]
"""

from __future__ import annotations

import numpy as np
from _common import cluster

import mpl.driver as mp

STEPS, RATE = 8, 0.5


def dataset(n: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    x = rng.normal(size=(n, 5))
    w_true = np.array([1.5, -2.0, 0.5, 1.0, -1.0])
    y = (x @ w_true + 0.3 * rng.normal(size=n) > 0).astype(np.float64)
    return x[:, :3], x[:, 3:], y


def p0_features() -> np.ndarray:
    return dataset()[0]


def p1_features_and_labels() -> tuple[np.ndarray, np.ndarray]:
    _, x1, y = dataset()
    return x1, y


def sigmoid(z):  # type: ignore[no-untyped-def]
    return 1 / (1 + np.exp(-z)) if isinstance(z, np.ndarray) else _jax_sigmoid(z)


def _jax_sigmoid(z):  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    return 1 / (1 + jnp.exp(-z))


def train(x0, x1, y, steps: int = STEPS, rate: float = RATE):  # type: ignore[no-untyped-def]
    """Plain gradient descent; runs under MPC on shares, or in numpy as the check."""
    xp = np if isinstance(x0, np.ndarray) else __import__("jax.numpy", fromlist=["x"])
    x = xp.concatenate([x0, x1], axis=1)
    w = xp.zeros(x.shape[1])
    for _ in range(steps):
        p = sigmoid(x @ w)
        w = w - rate * x.T @ (p - y) / x.shape[0]
    return w


@mp.function
def fit() -> mp.Value:
    x0 = mp.device("P0")(p0_features)()
    x1, y = mp.device("P1", nout=2)(p1_features_and_labels)()
    w = mp.device("SP0")(train)(x0, x1, y)
    return mp.put("P1", w)


if __name__ == "__main__":
    with cluster(__doc__.splitlines()[0], 3):
        w_mpc = mp.fetch(fit())
        w_plain = train(*dataset())
        np.set_printoptions(precision=4, suppress=True)
        print("MPC weights:      ", w_mpc)
        print("plaintext weights:", w_plain)
        print("max difference:   ", float(np.abs(w_mpc - w_plain).max()))
        assert np.allclose(w_mpc, w_plain, atol=2e-2)
