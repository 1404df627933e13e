"""Per-party statistics combined at one party.

Three hospitals each hold patient ages. Each computes count, sum and sum of squares on its
own data; only those three numbers go to P2, which combines them into the overall mean and
variance. No party sees another's records.

    python examples/party_stats.py              # starts a local 3-party cluster
    python examples/party_stats.py --url URL    # uses a running one
"""

from __future__ import annotations

import numpy as np
from _common import cluster

import mpl.driver as mp


def load_ages(seed: int, n: int) -> np.ndarray:
    """Stands for reading the party's own file: runs on that party's worker."""
    return np.random.default_rng(seed).normal(50 + 5 * seed, 12, size=n).round()


def summary(ages: np.ndarray) -> np.ndarray:
    return np.array([len(ages), ages.sum(), (ages**2).sum()])


def combine(*parts: np.ndarray) -> dict[str, float]:
    n, s, ss = np.sum(parts, axis=0)
    mean = s / n
    return {
        "patients": int(n),
        "mean age": round(float(mean), 3),
        "variance": round(float(ss / n - mean**2), 3),
    }


@mp.function
def hospital_stats() -> mp.Value:
    parts = []
    for rank in range(3):
        ages = mp.device(f"P{rank}")(load_ages)(rank, 1000 + 250 * rank)
        parts.append(mp.device(f"P{rank}")(summary)(ages))
    return mp.device("P2")(combine)(*parts)


if __name__ == "__main__":
    with cluster(__doc__.splitlines()[0], 3):
        result = mp.fetch(hospital_stats())
        everything = np.concatenate([load_ages(r, 1000 + 250 * r) for r in range(3)])
        print("joint statistics computed at P2:", result)
        print(
            f"check (all data in one place):    mean {everything.mean():.3f}, "
            f"variance {everything.var():.3f}"
        )
        assert abs(result["mean age"] - everything.mean()) < 1e-3
