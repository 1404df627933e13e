"""Per-session clusters: the spec a session runs on, given the broker's and the one asked for.

``mp.connect(url, cluster=spec)`` gives the session its own devices: ``spec``'s nodes must
be nodes of the broker's cluster (checked by name, and in secure mode by key), any subset
of them in any order, and its devices (PPUs, SPUs with their own protocol, field and
fxp bits) are built over those nodes. Ranks stay the broker's: the session's spec keeps
every node of the broker's cluster at its rank (so ops, moves and the workers' ranks agree)
and takes only the devices, and the named nodes' ``runtime_info``, from ``spec``.

A pure function, used by the broker (which refuses a bad spec when the session opens) and
by tests; nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import ClusterSpecError

__all__ = ["MAX_SESSION_DEVICES", "session_cluster", "spu_devices"]

MAX_SESSION_DEVICES = 1024  # devices one session's spec may declare (it comes from a driver)


def session_cluster(broker: ClusterSpec, requested: ClusterSpec | Mapping[str, Any]) -> ClusterSpec:
    """The spec of a session that asked for ``requested`` on a broker running ``broker``.

    Raises :class:`ClusterSpecError` naming the field: a node the broker does not know, a
    node or broker key that disagrees with the broker's, or an invalid spec.
    """
    if not isinstance(requested, ClusterSpec):
        requested = _parse(broker, requested)
    known = {n.name: n for n in broker.nodes}
    unknown = [n.name for n in requested.nodes if n.name not in known]
    if unknown:
        raise ClusterSpecError(
            f"nodes: {', '.join(map(repr, unknown))} "
            f"{'is not a node' if len(unknown) == 1 else 'are not nodes'} of the broker's "
            f"cluster; its nodes: {', '.join(known)}"
        )
    for node in requested.nodes:
        theirs = known[node.name].curve_key
        if node.curve_key and node.curve_key != theirs:
            raise ClusterSpecError(
                f"nodes.{node.name}.curve_key: disagrees with the key the broker pins for "
                f"{node.name!r}; check that both copies of the spec are the same"
            )
    if requested.broker_key and requested.broker_key != broker.broker_key:
        raise ClusterSpecError("broker.curve_key: disagrees with the broker's own key")
    info = {n.name: n.runtime_info for n in requested.nodes}
    nodes = tuple(
        dataclasses.replace(n, runtime_info=info.get(n.name, n.runtime_info)) for n in broker.nodes
    )
    return ClusterSpec(
        cluster_id=requested.cluster_id,
        nodes=nodes,
        devices=dict(requested.devices),
        broker_key=broker.broker_key,
        drivers=broker.drivers,
        trusted=broker.trusted,
    )


def _parse(broker: ClusterSpec, data: Mapping[str, Any]) -> ClusterSpec:
    if not isinstance(data, Mapping):
        raise ClusterSpecError(f"cluster: expected a mapping, got {type(data).__name__}")
    nodes, devices = data.get("nodes"), data.get("devices")
    # a driver's input: bound it before parsing (no spec is larger than the broker's)
    if isinstance(nodes, list) and len(nodes) > broker.world_size:
        raise ClusterSpecError(
            f"nodes: {len(nodes)} given, but the broker's cluster has {broker.world_size}"
        )
    if isinstance(devices, Mapping) and len(devices) > MAX_SESSION_DEVICES:
        raise ClusterSpecError(f"devices: at most {MAX_SESSION_DEVICES} per session")
    try:
        return ClusterSpec.from_dict(data)
    except ClusterSpecError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ClusterSpecError(f"cluster: not a valid spec ({exc})") from None


def spu_devices(cluster: Mapping[str, Any]) -> dict[str, list[int]]:
    """The SPU devices of a cluster spec in dict form (a session's or the broker's), each
    with its members' ranks in member order, as a driver's SPU ops name them (-1 for a
    member that is no node: no op can match it)."""
    nodes = cluster.get("nodes") or ()
    ranks = {n.get("name"): r for r, n in enumerate(nodes) if isinstance(n, Mapping)}
    devices = cluster.get("devices") or {}
    return {
        str(name): [ranks.get(m, -1) for m in d.get("members") or ()]
        for name, d in (devices.items() if isinstance(devices, Mapping) else ())
        if isinstance(d, Mapping) and d.get("kind") == "SPU"
    }
