"""mplang's device-basics tutorial (tutorials/00_device_basics.py), ported to mpl.

Written the mplang (v2) way: a ClusterSpec from a dict, `mp.make_simulator`,
`mp.set_root_context`, plain functions run through `mp.evaluate`, `.jax` on a PPU,
`mp.get_dev_attr`, and revealing a secret by `mp.put` to a PPU. Two edits, both listed in
docs/from-mplang.md: the import, and the cluster has no TEE device (mpl has none).

    python examples/mplang/device_basics.py
"""

import random

import jax.numpy as jnp

import mpl.driver as mp  # mplang: import mplang as mp

# Three parties: two plaintext devices and one SPU over all three nodes.
cluster_spec = mp.ClusterSpec.from_dict(
    {
        "nodes": [
            {"name": "node_0", "endpoint": "127.0.0.1:61920"},
            {"name": "node_1", "endpoint": "127.0.0.1:61921"},
            {"name": "node_2", "endpoint": "127.0.0.1:61922"},
        ],
        "devices": {
            "SP0": {
                "kind": "SPU",
                "members": ["node_0", "node_1", "node_2"],
                "config": {"protocol": "SEMI2K", "field": "FM128"},
            },
            "P0": {"kind": "PPU", "members": ["node_0"], "config": {}},
            "P1": {"kind": "PPU", "members": ["node_1"], "config": {}},
            # mplang: "TEE0": {"kind": "TEE", "members": ["node_2"], "config": {}},
        },
    }
)


def millionaire():
    """Placement named at every step."""
    x = mp.put("P0", jnp.array(random.randint(0, 10)))
    y = mp.put("P1", jnp.array(random.randint(0, 10)))
    less = mp.device("SP0")(lambda a, b: a < b)(x, y)  # JAX is the SPU's native frontend
    return x, y, less


def add(a, b):
    return a + b


def inferred():
    """No device named: the one device of the arguments, else the one SPU among them."""
    one = mp.put("P0", jnp.array(1))
    two = mp.put("P0", jnp.array(2))
    three = mp.put("P1", jnp.array(3))
    on_p0 = mp.device("P0").jax(add)(one, two)
    assert mp.get_dev_attr(on_p0) == "P0"
    secret = mp.put("SP0", on_p0)
    total = mp.device()(add)(secret, three)  # P1's value is sealed onto SP0 first
    assert mp.get_dev_attr(total) == "SP0"
    return total


def round_trip():
    """P0 -> SP0 -> compute under MPC -> back to P0."""
    start = mp.put("P0", jnp.array(42))
    sealed = mp.put("SP0", start)
    doubled = mp.device("SP0")(lambda v: v * 2)(sealed)
    return mp.put("P0", doubled)


def main():
    sim = mp.make_simulator(3, cluster_spec=cluster_spec)
    mp.set_root_context(sim)

    x, y, less = mp.evaluate(millionaire)
    a, b = mp.fetch(x), mp.fetch(y)
    revealed = mp.fetch(mp.evaluate(lambda: mp.put("P0", less)))
    print(f"P0 holds {a}, P1 holds {b}; x < y revealed to P0: {revealed}")
    assert bool(revealed) == (a < b)

    total = mp.fetch(mp.evaluate(lambda: mp.put("P0", mp.evaluate(inferred))))
    print(f"(1 + 2) + 3 under MPC, revealed to P0: {total}")
    assert int(total) == 6

    moved = mp.fetch(mp.evaluate(round_trip))
    print(f"42 doubled on SP0, back on P0: {moved}")
    assert int(moved) == 84

    ten = mp.evaluate(lambda: mp.put("P0", jnp.array(10)))
    print(f"device of a value put on P0: {mp.get_dev_attr(ten)}")
    assert mp.get_dev_attr(ten) == "P0"

    mp.set_root_context(None)
    sim.close()


if __name__ == "__main__":
    main()
