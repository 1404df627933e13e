"""Each party's own files, read and written by mpl's named kernels (no code shipped for I/O).

Alice (P0) and Bob (P1) each keep a CSV of their sales under their worker's --data-root.
`mp.kernel("mpl.io.read_csv")` reads it where it lives: the call names a kernel the workers
installed, so no function travels and the path cannot leave the party's data root. Their
joint total is computed under MPC, revealed to Alice only, and stored on her side as .npy.
On a secure worker a job's files go to its driver's own folder there (drivers/<name>); a
file the operator places at the data root itself is read by every driver the spec lists.

    python examples/party_files.py [--url URL | --sim]
"""

from __future__ import annotations

import numpy as np
from _common import cluster

import mpl.driver as mp

read_csv = mp.kernel("mpl.io.read_csv")
write_csv = mp.kernel("mpl.io.write_csv")
write_npy = mp.kernel("mpl.io.write_npy")
read_npy = mp.kernel("mpl.io.read_npy")


def books(seed: int) -> np.ndarray:
    """Stands for the sales a party already has on its own machine."""
    return np.random.default_rng(seed).integers(10, 100, size=(6, 2)).astype(np.float64)


@mp.function
def joint_total() -> mp.Value:
    alice = mp.device("P0")(read_csv)("books/sales.csv", skip_header=1)
    bob = mp.device("P1")(read_csv)("books/sales.csv", skip_header=1)
    total = mp.device("SP0")(lambda a, b: a[:, 1].sum() + b[:, 1].sum())(alice, bob)
    saved = mp.device("P0")(write_npy)("reports/joint_total.npy", mp.put("P0", total))
    return mp.device("P0")(read_npy)(saved)


if __name__ == "__main__":
    with cluster(__doc__.splitlines()[0], 2):
        for party, seed in (("P0", 7), ("P1", 8)):  # set-up for the demo: each party's file
            rows = mp.device(party)(books)(seed)
            mp.fetch(mp.device(party)(write_csv)("books/sales.csv", rows, header="day,amount"))
        total = mp.fetch(joint_total())
        print(f"joint sales total, revealed to and stored at P0: {float(total):.1f}")
        expected = books(7)[:, 1].sum() + books(8)[:, 1].sum()  # a check for the demo only
        assert abs(float(total) - expected) < 1e-2, (total, expected)
