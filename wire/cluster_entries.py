"""The entries of a cluster spec (``mpl.wire.cluster``): its nodes (with what each reports
about itself), the drivers a secure spec lists (with their keys and code policy), its
devices and an SPU device's settings; and how each is read from mplang's dict form, field
by field. Every field that does not read raises :class:`ClusterSpecError` naming it (e.g.
``drivers[0].curve_key: ...``). What holds across entries (names unique, members known,
all keys or none) is the spec's to check (``ClusterSpec``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mpl.wire.errors import ClusterSpecError
from mpl.wire.keys import is_z85_key
from mpl.wire.runtime_info import oversize

__all__ = [
    "DEVICE_KINDS",
    "DRIVER_CODE",
    "MAX_SPEC_NAME_CHARS",
    "SPU_FIELDS",
    "SPU_PROTOCOLS",
    "Device",
    "DriverKey",
    "Node",
    "RuntimeInfo",
    "SPUConfig",
    "driver_dict",
    "parse_device",
    "parse_driver",
    "parse_node",
    "read_key",
    "require",
    "spu_config",
]

SPU_PROTOCOLS = ("SEMI2K", "ABY3", "CHEETAH")
DRIVER_CODE = ("", "any", "kernels")  # a driver entry's code ("": the worker's --code)
SPU_FIELDS = ("FM64", "FM128")
# A driver's or a device's name is at most this many characters. Each crosses between
# workers inside names a peer's receiver bounds (a move's sealer, ``driver:`` and the name,
# at most MAX_MOVE_NAME_CHARS; an SPU lane id, the session id and the device name, at most
# MAX_SPU_NAME_BYTES): a longer name in the spec had every such message of a genuine job
# refused as malformed, so it is refused here, where its operator sees why. 64: what
# ``share_with`` and ``owner=`` accept of a driver's name already.
MAX_SPEC_NAME_CHARS = 64
DEVICE_KINDS = ("PPU", "SPU")
_PPU_ALIASES = ("LOCAL",)  # other spellings of a PPU, read as PPU
_LINK_KEYS = (
    "recv_timeout_ms",
    "connect_retry_times",
    "connect_retry_interval_ms",
    "http_max_payload_size",
)


@dataclass(frozen=True)
class RuntimeInfo:
    """What a node reports about itself; extra keys are kept and re-emitted flat."""

    version: str = "N/A"
    platform: str = "N/A"
    op_bindings: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    """One party. Its rank is its index in the cluster's node list."""

    name: str
    rank: int
    endpoint: str = ""
    runtime_info: RuntimeInfo = field(default_factory=RuntimeInfo)
    curve_key: str = ""  # its worker's CURVE public key (z85); "" in plaintext mode


@dataclass(frozen=True)
class DriverKey:
    """A driver allowed to use a secure cluster, and the public key it proves itself with.

    ``code``: what its jobs may run on a worker holding this spec (``"kernels"`` or
    ``"any"``; ``""``: as the worker's ``--code`` says)."""

    name: str
    curve_key: str
    code: str = ""


@dataclass(frozen=True)
class SPUConfig:
    """An SPU device's MPC settings, with defaults filled in."""

    protocol: str = "SEMI2K"
    field: str = "FM128"  # mplang's default
    fxp_fraction_bits: int = 18
    recv_timeout_ms: int = 30_000
    connect_retry_times: int = 30
    connect_retry_interval_ms: int = 100
    http_max_payload_size: int = 32 * 1024 * 1024


@dataclass(frozen=True)
class Device:
    """A logical device: a PPU (one party, plaintext) or an SPU (several parties, MPC)."""

    name: str
    kind: str
    members: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)


def require(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ClusterSpecError(f"{where}.{key}: missing key")
    return data[key]


def _name(raw: Mapping[str, Any], where: str) -> str:
    name = require(raw, "name", where)
    if not isinstance(name, str) or not name:
        raise ClusterSpecError(f"{where}.name: expected a non-empty string")
    return name


def parse_node(raw: Any, rank: int) -> Node:
    where = f"nodes[{rank}]"
    if not isinstance(raw, Mapping):
        raise ClusterSpecError(f"{where}: expected a mapping")
    name = _name(raw, where)
    endpoint = raw.get("endpoint", "") or ""
    if not isinstance(endpoint, str):
        raise ClusterSpecError(f"{where}.endpoint: expected a string")
    info = raw.get("runtime_info") or {}
    if not isinstance(info, Mapping):
        raise ClusterSpecError(f"{where}.runtime_info: expected a mapping")
    if (too_big := oversize(info)) is not None:  # it may come from a driver (a session's spec)
        raise ClusterSpecError(f"{where}.runtime_info: {too_big}")
    bindings = info.get("op_bindings") or {}
    if not isinstance(bindings, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in bindings.items()
    ):
        raise ClusterSpecError(f"{where}.runtime_info.op_bindings: expected str -> str")
    # YAML reads `version: 1.0` as a number: mplang accepts it, so keep its text.
    version = _text(info.get("version", "N/A"), f"{where}.runtime_info.version")
    platform = _text(info.get("platform", "N/A"), f"{where}.runtime_info.platform")
    extra = {k: v for k, v in info.items() if k not in ("version", "platform", "op_bindings")}
    key = read_key(raw.get("curve_key"), f"{where}.curve_key")
    return Node(name, rank, endpoint, RuntimeInfo(version, platform, dict(bindings), extra), key)


def read_key(value: Any, where: str) -> str:
    if value is None or value == "":
        return ""
    if not is_z85_key(value):
        raise ClusterSpecError(
            f"{where}: expected a 40-character z85 public key (see `mpl-keys show FILE`), "
            f"got {str(value)[:60]!r}"
        )
    return str(value)


def parse_driver(raw: Any, index: int) -> DriverKey:
    where = f"drivers[{index}]"
    if not isinstance(raw, Mapping):
        raise ClusterSpecError(f"{where}: expected a mapping {{name, curve_key}}")
    name = _short(_name(raw, where), f"{where}.name")
    key = read_key(require(raw, "curve_key", where), f"{where}.curve_key")
    if not key:
        raise ClusterSpecError(f"{where}.curve_key: missing key")
    code = raw.get("code", "")
    if code not in DRIVER_CODE:
        raise ClusterSpecError(
            f"{where}.code: expected one of {', '.join(DRIVER_CODE[1:])} (or no code: the "
            f"worker's --code), got {code!r}"
        )
    return DriverKey(name, key, code)


def driver_dict(driver: DriverKey) -> dict[str, str]:
    out = {"name": driver.name, "curve_key": driver.curve_key}
    if driver.code:
        out["code"] = driver.code
    return out


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ClusterSpecError(f"{where}: expected a string or a number, got {value!r}")


def _short(name: str, where: str) -> str:
    if len(name) > MAX_SPEC_NAME_CHARS:
        raise ClusterSpecError(
            f"{where}: a name of {len(name)} characters; at most {MAX_SPEC_NAME_CHARS}"
        )
    return name


def parse_device(name: str, raw: Any) -> Device:
    _short(name, f"devices.{name[:MAX_SPEC_NAME_CHARS]}...")
    where = f"devices.{name}"
    if not isinstance(raw, Mapping):
        raise ClusterSpecError(f"{where}: expected a mapping")
    kind = require(raw, "kind", where)
    if isinstance(kind, str) and kind.upper() in _PPU_ALIASES:
        kind = "PPU"  # mplang v1's per-node `local` devices are plaintext single-party devices
    if not isinstance(kind, str) or kind.upper() not in DEVICE_KINDS:
        raise ClusterSpecError(
            f"{where}.kind: unknown kind {kind!r}; expected PPU (or local) or SPU"
        )
    members = require(raw, "members", where)
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ClusterSpecError(f"{where}.members: expected a list of node names")
    config = raw.get("config") or {}
    if not isinstance(config, Mapping):
        raise ClusterSpecError(f"{where}.config: expected a mapping")
    return Device(name, kind.upper(), tuple(members), dict(config))


def spu_config(config: Mapping[str, Any], where: str) -> SPUConfig:
    # mplang nests runtime settings under runtime_config and link settings under link_desc.
    flat = {**config.get("runtime_config", {}), **config.get("link_desc", {}), **config}
    protocol = flat.get("protocol", "SEMI2K")
    if not isinstance(protocol, str) or protocol.upper() not in SPU_PROTOCOLS:
        raise ClusterSpecError(
            f"{where}.protocol: unknown SPU protocol {protocol!r}; expected one of "
            f"{', '.join(SPU_PROTOCOLS)}"
        )
    fld = flat.get("field", "FM128")
    if not isinstance(fld, str) or fld.upper() not in SPU_FIELDS:
        raise ClusterSpecError(
            f"{where}.field: unknown SPU field {fld!r}; expected one of {', '.join(SPU_FIELDS)}"
        )
    ints: dict[str, int] = {}
    for key in ("fxp_fraction_bits", *_LINK_KEYS):
        if key in flat:
            value = flat[key]
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ClusterSpecError(f"{where}.{key}: expected a positive int, got {value!r}")
            ints[key] = value
    bits = ints.get("fxp_fraction_bits", 18)
    if bits >= (62 if fld.upper() == "FM64" else 126):
        raise ClusterSpecError(f"{where}.fxp_fraction_bits: {bits} is too large for {fld}")
    return SPUConfig(protocol=protocol.upper(), field=fld.upper(), **ints)
