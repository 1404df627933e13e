"""mplang's README program (the millionaires' problem), ported to mpl.

Written exactly as mplang's README writes it: `mp.Simulator`, `mp.evaluate(sim, fn)` and
`mp.fetch(sim, value)`. The one edit is the import (see docs/from-mplang.md).

    python examples/mplang/millionaire.py
"""

import random

import mpl.driver as mp  # mplang: import mplang as mp


def randint(lo, hi):
    # The README leaves randint undefined. A function draws from the random module of the
    # party that runs it; `from random import randint` would instead ship the driver's
    # generator, state included, so both parties would draw the same number.
    return random.randint(lo, hi)


@mp.function
def millionaire():
    x = mp.device("P0")(randint)(0, 1000000)  # Alice's wealth, drawn on her machine
    y = mp.device("P1")(randint)(0, 1000000)  # Bob's, on his
    z = mp.device("SP0")(lambda a, b: a < b)(x, y)  # compared under MPC
    return x, y, z  # the README returns z only; x and y come back to check the answer


if __name__ == "__main__":
    sim = mp.Simulator.simple(2)
    x, y, z = mp.evaluate(sim, millionaire)
    # fetching z rebuilds the secret at the driver: a reveal to whoever runs this script
    result = mp.fetch(sim, z)
    print("result:", result)
    # a check for this demo only: the parties would never send their wealth to the driver
    a, b = mp.fetch(sim, x), mp.fetch(sim, y)
    print(f"alice={a} bob={b}: alice is poorer = {a < b}")
    assert bool(result) == (a < b)
    sim.close()
