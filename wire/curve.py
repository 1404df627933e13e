"""CurveZMQ on mpl's sockets: what a process proves, whom it lets in, whom it dials.

Secure mode (the cluster spec pins keys, ARCHITECTURE.md section 6) puts every socket on
CurveZMQ. Servers (the broker's ROUTER, each worker's data and SPU PULL sockets) accept a
client only when this process's gatekeeper, its ZAP handler (``mpl.wire.zap``), finds the client's
key in ITS OWN copy of the spec; clients pin the server key from that same copy, never from
anything received over the network. The gatekeeper names each admitted key's owner
(``node:<name>`` / ``driver:<name>``), and ZeroMQ stamps that name on every frame that
connection delivers (:func:`mpl.wire.identity.frame_identity`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import zmq

from mpl.wire.cluster import ClusterSpec
from mpl.wire.identity import driver_identity, frame_identity, node_identity, rank_of
from mpl.wire.keys import KeyPair

__all__ = [
    "BROKER_DOMAIN",
    "PEER_DOMAIN",
    "Curve",
    "broker_admits",
    "peer_admits",
    "plaintext_safe",
]

BROKER_DOMAIN = "mpl-broker"  # the broker's ROUTER: workers and drivers
PEER_DOMAIN = "mpl-peer"  # a worker's data and SPU sockets: the other workers only


@dataclass(frozen=True)
class Curve:
    """This process's key pair and the spec whose keys it trusts.

    A driver may know only the broker's key (``broker_key``) instead of a whole spec.
    """

    keys: KeyPair
    cluster: ClusterSpec | None = None
    broker_key: str = ""
    _ranks: dict[str, int | None] = field(default_factory=dict, compare=False, repr=False)

    @property
    def broker(self) -> str:
        """The broker's public key, from the spec this process trusts."""
        key = self.broker_key or (self.cluster.broker_key if self.cluster else "")
        if not key:
            raise ValueError("no broker key: give a secure cluster spec or broker_key")
        return key

    def node_key(self, rank: int) -> str:
        """Rank ``rank``'s public key, from this process's own spec."""
        if self.cluster is None or not 0 <= rank < self.cluster.world_size:
            raise KeyError(f"rank {rank} has no key in this process's cluster spec")
        return self.cluster.nodes[rank].curve_key

    def serve(self, sock: zmq.Socket[Any], domain: str) -> None:
        """Make ``sock`` a CURVE server whose clients this process's gatekeeper vets."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public.encode("ascii"))
        sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode("ascii"))

    def dial(self, sock: zmq.Socket[Any], server_key: str) -> None:
        """Make ``sock`` a CURVE client that talks only to the holder of ``server_key``."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public.encode("ascii"))
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret.encode("ascii"))

    def sender_rank(self, frame: Any) -> int | None:
        """The rank of the worker whose authenticated connection delivered ``frame``."""
        who = frame_identity(frame)
        if who is None or self.cluster is None:
            return None
        ranks = self._ranks
        if who not in ranks:  # identities are few (one per node): remember each lookup
            ranks[who] = rank_of(who, self.cluster)
        return ranks[who]


def broker_admits(cluster: ClusterSpec) -> dict[str, dict[str, str]]:
    """Who may connect to the broker: every node's worker and every listed driver."""
    allowed = {n.curve_key: node_identity(n.name) for n in cluster.nodes}
    allowed.update({d.curve_key: driver_identity(d.name) for d in cluster.drivers})
    return {BROKER_DOMAIN: allowed}


def peer_admits(cluster: ClusterSpec) -> dict[str, dict[str, str]]:
    """Who may connect to a worker's data and SPU sockets: the nodes' workers only."""
    return {PEER_DOMAIN: {n.curve_key: node_identity(n.name) for n in cluster.nodes}}


def plaintext_safe(endpoint: str) -> bool:
    """True if a plaintext socket bound at ``endpoint`` is reachable from this host only:
    inproc, ipc, or TCP on a loopback address (127.0.0.0/8, ::1, localhost)."""
    if endpoint.startswith(("inproc://", "ipc://")):
        return True
    host = endpoint.removeprefix("tcp://")
    if endpoint.startswith("tcp://"):
        host = host.rpartition(":")[0]
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface name, a host name: may face the network
        return False
