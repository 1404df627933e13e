"""The millionaires' problem: who is richer, without either revealing their wealth.

Alice's wealth lives on P0 and Bob's on P1. The comparison runs under MPC on SP0: each
party secret-shares its number to the SPU members, and only the one-bit answer is revealed
(to Alice). Neither party, nor the driver, ever sees the other number.

    python examples/millionaire.py [--url URL [--key K --cluster C] | --sim | --secure]
"""

from __future__ import annotations

import numpy as np
from _common import cluster

import mpl.driver as mp


def wealth(seed: int) -> np.int64:
    """Stands for reading the party's own books (on its own machine)."""
    return np.random.default_rng(seed).integers(1_000_000, 10_000_000)


@mp.function
def richer() -> tuple[mp.Value, mp.Value, mp.Value]:
    alice = mp.device("P0")(wealth)(2026)
    bob = mp.device("P1")(wealth)(1126)
    alice_is_poorer = mp.device("SP0")(lambda a, b: a < b)(alice, bob)
    return mp.put("P0", alice_is_poorer), alice, bob  # reveal the answer to Alice only


if __name__ == "__main__":
    with cluster(__doc__.splitlines()[0], 3):
        answer, alice, bob = richer()
        verdict = "Bob" if mp.fetch(answer) else "Alice"
        print(f"MPC: the richer one is {verdict}")
        # a check for this demo only: in production the parties would never fetch these
        a, b = mp.fetch(alice), mp.fetch(bob)
        print(f"plaintext check: alice={a}, bob={b} -> {'Bob' if a < b else 'Alice'}")
        assert (a < b) == mp.fetch(answer)
