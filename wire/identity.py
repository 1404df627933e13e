"""Who sent a message: identities that come from authenticated keys, never from fields.

In secure mode every socket runs CurveZMQ, and each process's ZAP handler maps an admitted
public key to an identity string: ``node:<name>`` for a node's worker, ``driver:<name>`` for
a driver, ``broker`` for the broker. ZeroMQ stamps that string on every frame it receives
over the connection (the ``User-Id`` property); the ZeroMQ shells read it with
:func:`frame_identity` and hand it to the pure cores as ``who``.

``who is None`` means plaintext mode: nothing is authenticated, which is why daemons
without keys bind loopback or inproc only. The cores then fall back to what the transport
does give them (the ROUTER's routing identity of the socket that registered a rank).
"""

from __future__ import annotations

from typing import Any

import zmq

from mpl.wire.cluster import ClusterSpec

__all__ = [
    "BROKER",
    "DRIVER_PREFIX",
    "NODE_PREFIX",
    "USER_ID",
    "driver_identity",
    "driver_name",
    "frame_identity",
    "node_identity",
    "rank_of",
]

# The frame property ZeroMQ stamps the authenticated identity on. A loop that reads it for
# every message (the broker's) calls ``frame.get(USER_ID)`` itself, on the zmq.Frame it
# received: frame_identity's call and checks cost ~1.1k instructions a message on top of
# the read's ~3.4k (pyzmq's own version check included). In secure mode every frame a
# CURVE server receives has it (the gatekeeper names each key it admits); a missing one
# raises, an empty one names nobody.
USER_ID = b"User-Id"  # bytes: pyzmq encodes a str key on every read (~0.5k instructions)
BROKER = "broker"
NODE_PREFIX = "node:"
DRIVER_PREFIX = "driver:"


def node_identity(name: str) -> str:
    """The identity of node ``name``'s worker."""
    return NODE_PREFIX + name


def driver_identity(name: str) -> str:
    """The identity of the driver called ``name`` in the spec's ``drivers`` list."""
    return DRIVER_PREFIX + name


def driver_name(who: str | None) -> str | None:
    """The driver name in ``who``, or ``None`` when ``who`` is not a driver identity."""
    if who is not None and who.startswith(DRIVER_PREFIX):
        return who[len(DRIVER_PREFIX) :]
    return None


def rank_of(who: str | None, cluster: ClusterSpec) -> int | None:
    """The rank of the node whose identity is ``who`` in ``cluster``, else ``None``."""
    if who is None or not who.startswith(NODE_PREFIX):
        return None
    name = who[len(NODE_PREFIX) :]
    for node in cluster.nodes:
        if node.name == name:
            return node.rank
    return None


def frame_identity(frame: Any) -> str | None:
    """The authenticated identity ZeroMQ attached to a received ``zmq.Frame``.

    ``None`` on a plaintext connection (no ZAP handler ran, so libzmq has no User-Id) or
    when ``frame`` is plain bytes (received with ``copy=True``).
    """
    if not isinstance(frame, zmq.Frame):
        return None
    try:
        value = frame.get(USER_ID)
    except zmq.ZMQError:
        return None
    return value if isinstance(value, str) and value else None
