"""Identities from authenticated keys: parsing, and reading them off received frames."""

from __future__ import annotations

import zmq

from mpl.wire.cluster import ClusterSpec
from mpl.wire.identity import driver_identity, driver_name, frame_identity, node_identity, rank_of


def test_node_and_driver_identities_map_back() -> None:
    spec = ClusterSpec.simple(3)
    assert rank_of(node_identity("node2"), spec) == 2
    assert rank_of(node_identity("nodeX"), spec) is None
    assert rank_of(driver_identity("node1"), spec) is None  # a driver is never a rank
    assert rank_of(None, spec) is None
    assert driver_name(driver_identity("analyst")) == "analyst"
    assert driver_name(node_identity("analyst")) is None


def test_plaintext_frames_carry_no_identity() -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    try:
        for s in (pull, push):
            s.setsockopt(zmq.LINGER, 0)
        push.connect(f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}")
        push.send(b"x")
        assert pull.poll(5000)
        frame = pull.recv(copy=False)
        assert frame_identity(frame) is None
        assert frame_identity(b"x") is None
    finally:
        push.close()
        pull.close()
        ctx.term()
