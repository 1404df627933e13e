"""ClusterSpec: the parties (nodes, by rank) and the devices built on them.

The dict/YAML form is mplang's::

    cluster_id: demo                 # optional, default "cluster_<n>"
    nodes:                           # a list: rank = index
      - name: alice
        endpoint: "127.0.0.1:6000"   # optional, informational here (workers dial the broker)
        runtime_info: {version: "1", platform: linux, op_bindings: {}, any_key: kept}
    devices:
      P0:  {kind: PPU, members: [alice]}
      SP0: {kind: SPU, members: [alice, bob], config: {protocol: SEMI2K, field: FM64}}
      local_1: {kind: local, members: [bob]}   # mplang v1 spelling: read as a PPU
    trusted: false                   # optional: true lets pickles cross between parties

Secure mode (ARCHITECTURE.md section 6) pins every party's CURVE public key (z85, made with
``mpl-keys new NAME``)::

    broker: {curve_key: "<z85>"}
    nodes:
      - {name: alice, curve_key: "<z85>"}
    drivers:
      - {name: analyst, curve_key: "<z85>"}
      - {name: partner, curve_key: "<z85>", code: kernels}

A driver's ``code`` is what this copy's holder (a node's operator) lets that driver's jobs
run on its worker: ``kernels`` (named kernels and built-in ops only, anything pickled
refused) or ``any`` (any function it ships); absent, the worker's ``mpl-worker --code``
decides. Each worker honours its own copy: list another organisation's driver with
``code: kernels``. Drivers and the broker ignore it.

Either the broker, every node and at least one driver have keys, or nothing has: a spec
with some keys is refused rather than half secure.

``from_dict(to_dict(spec)) == spec`` always holds. Every validation failure raises
:class:`ClusterSpecError` naming the field, e.g. ``devices.P0.members: a PPU has exactly one
member, got 2``. Each entry (a node, driver, device, an SPU's settings) is read and checked
by ``mpl.wire.cluster_entries``; what holds across them is checked here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpl.wire.cluster_entries import (
    DEVICE_KINDS,
    DRIVER_CODE,
    SPU_FIELDS,
    SPU_PROTOCOLS,
    Device,
    DriverKey,
    Node,
    RuntimeInfo,
    SPUConfig,
    driver_dict,
    parse_device,
    parse_driver,
    parse_node,
    read_key,
    require,
    spu_config,
)
from mpl.wire.errors import ClusterSpecError

__all__ = [
    "DRIVER_CODE",
    "SPU_FIELDS",
    "SPU_PROTOCOLS",
    "ClusterSpec",
    "Device",
    "DriverKey",
    "Node",
    "RuntimeInfo",
    "SPUConfig",
]

# Members each protocol runs with: ABY3 is 3-party replicated sharing, CHEETAH is 2-party only.
_PROTOCOL_PARTIES = {"ABY3": 3, "CHEETAH": 2}


@dataclass(frozen=True)
class ClusterSpec:
    """The nodes and devices of one cluster. Build it with :meth:`simple` or :meth:`from_dict`."""

    cluster_id: str
    nodes: tuple[Node, ...]
    devices: dict[str, Device]
    broker_key: str = ""  # the broker's CURVE public key; "" in plaintext mode
    drivers: tuple[DriverKey, ...] = ()
    # One organisation runs every party: values crossing between parties may be pickles
    # (mpl.wire.safe_values). Each process honours its own copy, never one from the network.
    trusted: bool = False

    def __post_init__(self) -> None:
        _validate(self)

    # -- lookups --------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.nodes)

    @property
    def secure(self) -> bool:
        """True when the spec pins keys: every socket then runs CurveZMQ."""
        return bool(self.broker_key)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r}")

    def device(self, name: str) -> Device:
        """The device called ``name``; ``KeyError`` listing the devices that exist otherwise."""
        try:
            return self.devices[name]
        except KeyError:
            raise KeyError(
                f"no device {name!r}; devices: {', '.join(sorted(self.devices))}"
            ) from None

    def ranks(self, device: str) -> tuple[int, ...]:
        """The member ranks of ``device``, in member order."""
        return tuple(self.node(m).rank for m in self.device(device).members)

    def ppu_of(self, rank: int) -> str | None:
        """The PPU device whose member is ``rank``, if any."""
        for d in self.devices.values():
            if d.kind == "PPU" and self.node(d.members[0]).rank == rank:
                return d.name
        return None

    def spu_config(self, device: str) -> SPUConfig:
        d = self.device(device)
        if d.kind != "SPU":
            raise ValueError(f"device {device!r} is a {d.kind}, not an SPU")
        return spu_config(d.config, f"devices.{device}.config")

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def simple(
        cls,
        world_size: int,
        *,
        spu_protocol: str = "SEMI2K",
        spu_field: str = "FM128",
        fxp_fraction_bits: int = 18,
        spu_members: Sequence[int] | None = None,
        enable_spu: bool = True,
        endpoints: Sequence[str] | None = None,
        cluster_id: str | None = None,
        trusted: bool = False,
        runtime_version: str = "simulated",
        runtime_platform: str = "simulated",
        op_bindings: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
        enable_ppu_device: bool = True,
        enable_local_device: bool = True,
        enable_spu_device: bool = True,
    ) -> ClusterSpec:
        """Nodes ``node0..node{n-1}``, PPUs ``P0..P{n-1}``, ``local_0..local_{n-1}`` and one
        SPU ``SP0``, with mplang's keywords and defaults.

        - ``SP0`` spans every node unless ``spu_members`` (ranks) says otherwise; SEMI2K over
          FM128 by default, as in mplang. A single node gets no SPU; ``enable_spu=False`` (or
          mplang's ``enable_spu_device=False``) makes a plaintext-only cluster of any size.
        - ``local_{i}`` are mplang v1's per-node devices (kind ``local``, run as PPUs: the same
          party as ``P{i}``); ``enable_local_device=False`` / ``enable_ppu_device=False`` drop
          either family.
        - Endpoints default to ``localhost:{5000+i}`` (informational: workers dial the broker).
        - ``runtime_version`` / ``runtime_platform`` fill each node's ``runtime_info``;
          ``op_bindings`` is one ``{logical op: kernel id}`` mapping per node (a list of
          ``world_size`` mappings), or one mapping for every node.
        - ``trusted=True`` lets pickles cross between parties (one organisation runs them all).
        """
        if not isinstance(world_size, int) or world_size < 1:
            raise ClusterSpecError(f"world_size: must be a positive int, got {world_size!r}")
        if endpoints is not None and len(endpoints) != world_size:
            raise ClusterSpecError(f"endpoints: {len(endpoints)} given for {world_size} nodes")
        bindings = _simple_bindings(op_bindings, world_size)
        with_spu = enable_spu and enable_spu_device and (world_size >= 2 or spu_members is not None)
        if not (enable_ppu_device or enable_local_device or with_spu):
            raise ClusterSpecError(
                "devices: enable at least one of the PPU, local or SPU device families"
            )
        nodes = [
            {
                "name": f"node{i}",
                "endpoint": endpoints[i] if endpoints else f"localhost:{5000 + i}",
                "runtime_info": {
                    "version": runtime_version,
                    "platform": runtime_platform,
                    "op_bindings": bindings[i],
                },
            }
            for i in range(world_size)
        ]
        devices: dict[str, Any] = {}
        if enable_ppu_device:
            devices.update(
                {f"P{i}": {"kind": "PPU", "members": [f"node{i}"]} for i in range(world_size)}
            )
        if enable_local_device:
            devices.update(
                {
                    f"local_{i}": {"kind": "local", "members": [f"node{i}"]}
                    for i in range(world_size)
                }
            )
        if with_spu:
            members = list(range(world_size)) if spu_members is None else list(spu_members)
            devices["SP0"] = {
                "kind": "SPU",
                "members": [f"node{r}" for r in members],
                "config": {
                    "protocol": spu_protocol,
                    "field": spu_field,
                    "fxp_fraction_bits": fxp_fraction_bits,
                },
            }
        return cls.from_dict(
            {
                "cluster_id": cluster_id or f"sim_{world_size}",
                "nodes": nodes,
                "devices": devices,
                "trusted": trusted,
            }
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSpec:
        """Parse mplang's dict form; see the module docstring."""
        if not isinstance(data, Mapping):
            raise ClusterSpecError(f"cluster: expected a mapping, got {type(data).__name__}")
        raw_nodes = require(data, "nodes", "cluster")
        raw_devices = require(data, "devices", "cluster")
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise ClusterSpecError("nodes: expected a non-empty list")
        if not isinstance(raw_devices, Mapping):
            raise ClusterSpecError("devices: expected a mapping of name to device")
        nodes = tuple(parse_node(n, i) for i, n in enumerate(raw_nodes))
        devices = {str(k): parse_device(str(k), v) for k, v in raw_devices.items()}
        cluster_id = data.get("cluster_id") or f"cluster_{len(nodes)}"
        if not isinstance(cluster_id, str):
            raise ClusterSpecError("cluster_id: expected a string")
        trusted = data.get("trusted", False)
        if not isinstance(trusted, bool):
            raise ClusterSpecError(f"trusted: expected true or false, got {trusted!r}")
        broker = data.get("broker") or {}
        if not isinstance(broker, Mapping):
            raise ClusterSpecError("broker: expected a mapping such as {curve_key: <z85>}")
        raw_drivers = data.get("drivers") or []
        if not isinstance(raw_drivers, list):
            raise ClusterSpecError("drivers: expected a list of {name, curve_key}")
        return cls(
            cluster_id=cluster_id,
            nodes=nodes,
            devices=devices,
            broker_key=read_key(broker.get("curve_key"), "broker.curve_key"),
            drivers=tuple(parse_driver(d, i) for i, d in enumerate(raw_drivers)),
            trusted=trusted,
        )

    @classmethod
    def from_yaml(cls, source: str | Path) -> ClusterSpec:
        """Load from a YAML file path, or from YAML text."""
        import yaml  # only the YAML paths need it

        is_path = isinstance(source, Path) or ("\n" not in source and Path(source).is_file())
        text = Path(source).read_text() if is_path else str(source)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ClusterSpecError(f"cluster YAML does not parse: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | Path) -> ClusterSpec:
        """Load a ``.json`` file with the json module, anything else as YAML."""
        path = Path(path)
        if path.suffix == ".json":
            import json

            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ClusterSpecError(f"cluster JSON does not parse: {exc}") from exc
            return cls.from_dict(data)
        return cls.from_yaml(path)

    def to_dict(self) -> dict[str, Any]:
        """The dict form; ``from_dict`` of it gives an equal spec."""
        nodes = []
        for n in self.nodes:
            ri = n.runtime_info
            info: dict[str, Any] = {
                "version": ri.version,
                "platform": ri.platform,
                "op_bindings": dict(ri.op_bindings),
                **ri.extra,
            }
            node: dict[str, Any] = {"name": n.name, "endpoint": n.endpoint, "runtime_info": info}
            if n.curve_key:
                node["curve_key"] = n.curve_key
            nodes.append(node)
        devices = {
            d.name: {"kind": d.kind, "members": list(d.members), "config": dict(d.config)}
            for d in self.devices.values()
        }
        out: dict[str, Any] = {"cluster_id": self.cluster_id, "nodes": nodes, "devices": devices}
        if self.trusted:
            out["trusted"] = True
        if self.broker_key:
            out["broker"] = {"curve_key": self.broker_key}
        if self.drivers:
            out["drivers"] = [driver_dict(d) for d in self.drivers]
        return out

    def with_keys(
        self, broker: str, nodes: Sequence[str], drivers: Mapping[str, str]
    ) -> ClusterSpec:
        """This spec with CURVE keys pinned: ``nodes`` by rank, ``drivers`` by name."""
        data = self.to_dict()
        if len(nodes) != self.world_size:
            raise ClusterSpecError(f"nodes: {len(nodes)} keys given for {self.world_size} nodes")
        for node, key in zip(data["nodes"], nodes, strict=True):
            node["curve_key"] = key
        data["broker"] = {"curve_key": broker}
        codes = {d.name: d.code for d in self.drivers}  # kept for the names listed here
        data["drivers"] = [
            driver_dict(DriverKey(n, k, codes.get(n, ""))) for n, k in drivers.items()
        ]
        return ClusterSpec.from_dict(data)

    def to_yaml(self) -> str:
        import yaml

        text: str = yaml.safe_dump(self.to_dict(), sort_keys=False)
        return text


def _simple_bindings(
    op_bindings: Sequence[Mapping[str, str]] | Mapping[str, str] | None, world_size: int
) -> list[dict[str, str]]:
    """``ClusterSpec.simple``'s op_bindings: one mapping per node, or one for all."""
    if op_bindings is None:
        return [{} for _ in range(world_size)]
    if isinstance(op_bindings, Mapping):
        return [dict(op_bindings) for _ in range(world_size)]
    if len(op_bindings) != world_size:
        raise ClusterSpecError(f"op_bindings: {len(op_bindings)} given for {world_size} nodes")
    return [dict(b or {}) for b in op_bindings]


def _validate(spec: ClusterSpec) -> None:
    seen: dict[str, int] = {}
    for i, node in enumerate(spec.nodes):
        if node.rank != i:
            raise ClusterSpecError(f"nodes[{i}].rank: must equal its index {i}, got {node.rank}")
        if node.name in seen:
            raise ClusterSpecError(
                f"nodes[{i}].name: duplicate node {node.name!r} (also nodes[{seen[node.name]}])"
            )
        seen[node.name] = i
    if not spec.devices:
        raise ClusterSpecError("devices: a cluster needs at least one device")
    _validate_keys(spec)
    for key, dev in spec.devices.items():
        where = f"devices.{key}"
        if dev.name != key:
            raise ClusterSpecError(f"{where}.name: does not match its key ({dev.name!r})")
        if dev.kind not in DEVICE_KINDS:
            raise ClusterSpecError(f"{where}.kind: unknown kind {dev.kind!r}")
        for m in dev.members:
            if m not in seen:
                raise ClusterSpecError(f"{where}.members: unknown member {m!r}")
        if len(set(dev.members)) != len(dev.members):
            raise ClusterSpecError(f"{where}.members: a member is listed twice")
        if dev.kind == "PPU" and len(dev.members) != 1:
            raise ClusterSpecError(
                f"{where}.members: a PPU has exactly one member, got {len(dev.members)}"
            )
        if dev.kind == "SPU":
            cfg = spu_config(dev.config, f"{where}.config")
            if len(dev.members) < 2:
                raise ClusterSpecError(
                    f"{where}.members: an SPU needs a world size of at least 2, "
                    f"got {len(dev.members)}"
                )
            need = _PROTOCOL_PARTIES.get(cfg.protocol)
            if need is not None and len(dev.members) != need:
                raise ClusterSpecError(
                    f"{where}.members: {cfg.protocol} runs with exactly {need} members, "
                    f"got {len(dev.members)}"
                )


def _validate_keys(spec: ClusterSpec) -> None:
    """All keys or none, and no key or driver name (by case too) used twice."""
    keyed = [f"nodes[{n.rank}].curve_key" for n in spec.nodes if n.curve_key]
    if spec.broker_key:
        keyed.append("broker.curve_key")
    keyed += [f"drivers[{i}]" for i in range(len(spec.drivers))]
    if not keyed:
        return
    hint = "a secure spec pins the broker's, every node's and at least one driver's key"
    if not spec.broker_key:
        raise ClusterSpecError(f"broker.curve_key: missing key ({hint}; {keyed[0]} has one)")
    for node in spec.nodes:
        if not node.curve_key:
            raise ClusterSpecError(f"nodes[{node.rank}].curve_key: missing key ({hint})")
    if not spec.drivers:
        raise ClusterSpecError(f"drivers: missing; {hint}")
    owners: dict[str, str] = {spec.broker_key: "broker.curve_key"}
    names: dict[str, int] = {}
    fields = [(f"nodes[{n.rank}].curve_key", n.curve_key) for n in spec.nodes]
    fields += [(f"drivers[{i}].curve_key", d.curve_key) for i, d in enumerate(spec.drivers)]
    for where, key in fields:
        if key in owners:  # one key, two identities: ZAP could not tell who is speaking
            raise ClusterSpecError(f"{where}: the same key as {owners[key]}")
        owners[key] = where
    for i, d in enumerate(spec.drivers):
        # by case too: each names a folder of the worker's (kernel_table.driver_root), one
        # folder for both on a file system that folds case
        folded = d.name.lower()  # (a driver name is ASCII)
        if folded in names:
            raise ClusterSpecError(
                f"drivers[{i}].name: duplicate driver {d.name!r} (also drivers[{names[folded]}]"
                ", names compared without case)"
            )
        names[folded] = i
