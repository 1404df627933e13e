"""A 3-party data pipeline with shuffles.

P0 produces raw readings, P1 cleans them, P2 aggregates, and the cleaned data is also
shared back with P0 for its own records. Written with the party API (``mp.simp``) and the
collectives, and run as ONE job by ``@mp.function``.

    python examples/pipeline.py [--url URL | --sim]
"""

from __future__ import annotations

import numpy as np
from _common import cluster

import mpl.driver as mp


def produce(n: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    readings = rng.normal(20.0, 3.0, size=n)
    readings[::17] = np.nan  # broken sensor readings
    return readings


def clean(raw: np.ndarray) -> np.ndarray:
    return raw[~np.isnan(raw)]


def aggregate(values: np.ndarray) -> dict[str, float]:
    return {
        "n": int(values.size),
        "mean": round(float(values.mean()), 4),
        "p95": round(float(np.percentile(values, 95)), 4),
    }


@mp.function
def pipeline(n: int) -> tuple[mp.Value, mp.Value]:
    raw = mp.simp.pcall((0,), produce, n)
    at_cleaner = mp.collective.transfer(raw, to=1)
    cleaned = mp.simp.pcall((1,), clean, at_cleaner)
    both = mp.collective.replicate(cleaned, to=(0, 2))  # P0 keeps a copy, P2 aggregates
    report = mp.simp.pcall((0, 2), aggregate, both)
    return report, mp.simp.pcall((0,), len, both)


if __name__ == "__main__":
    with cluster(__doc__.splitlines()[0], 3) as ctx:
        report, kept = pipeline(500)
        by_rank = mp.fetch(report)
        print("report at P0 and P2:", by_rank[0], by_rank[2])
        print("rows P0 kept:", mp.fetch(kept))
        print("ops in the one job:", len(mp.compile(pipeline, 500).graph.ops))
        expected = aggregate(clean(produce(500)))
        assert by_rank[0] == by_rank[2] == expected, (by_rank, expected)
