"""Secret shares on the wire, and the share arithmetic both workers and drivers need.

An SPU value is held as one :class:`SpuShare` per member (or a list/tuple/dict of them when
the value is a structure). A share is libspu's serialized meta plus its chunks; the chunks
travel as raw frames. The plaintext's shape and dtype ride along so members can compile
for the actual inputs and ``repr`` can say what a secret holds.

The ``spu`` package (which imports jax) is loaded on first use only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpl.wire.record import Record
from mpl.wire.spu_compile_cache import guard_compile_cache

__all__ = [
    "SpuShare",
    "flatten",
    "io_for",
    "libspu",
    "make_shares",
    "map_shares",
    "reconstruct",
    "runtime_config",
]


@dataclass(eq=False, repr=False)
class SpuShare(Record, tag="spushare"):
    """One member's share of one array."""

    meta: bytes
    chunks: list[bytes]
    shape: tuple[int, ...]
    dtype: str
    secret: bool = True

    def mpl_describe(self) -> str:
        kind = "secret" if self.secret else "public"
        return f"{kind} {self.dtype}[{', '.join(map(str, self.shape))}]"

    def to_libspu(self) -> Any:
        share = libspu().Share()
        share.meta = self.meta
        share.share_chunks = list(self.chunks)
        return share

    @classmethod
    def from_libspu(
        cls, share: Any, shape: tuple[int, ...], dtype: str, secret: bool = True
    ) -> SpuShare:
        return cls(bytes(share.meta), [bytes(c) for c in share.share_chunks], shape, dtype, secret)


def libspu() -> Any:
    """The ``spu.libspu`` module, imported on first use (with 64-bit jax); spu's compile
    cache is made safe for threads then (``spu_compile_cache.py``)."""
    global _guarded
    os.environ.setdefault("JAX_ENABLE_X64", "1")
    import spu.libspu as lib

    if not _guarded:
        _guarded = guard_compile_cache()
    return lib


_guarded = False


def _key(config: Mapping[str, Any]) -> tuple[str, str, int]:
    return (
        str(config.get("protocol", "SEMI2K")),
        str(config.get("field", "FM64")),
        int(config.get("fxp_fraction_bits", 18)),
    )


_cache = threading.local()  # libspu objects are cheap to reuse, not to build (per thread)


def runtime_config(config: Mapping[str, Any]) -> Any:
    """A libspu RuntimeConfig from a device's ``{protocol, field, fxp_fraction_bits}``."""
    configs = _cache.__dict__.setdefault("configs", {})
    key = _key(config)
    cfg = configs.get(key)
    if cfg is None:
        cfg = configs[key] = _new_config(key)
    return cfg


def _new_config(key: tuple[str, str, int]) -> Any:
    protocol, field, bits = key
    lib = libspu()
    cfg = lib.RuntimeConfig()
    cfg.protocol = getattr(lib.ProtocolKind, protocol)
    cfg.field = getattr(lib.FieldType, field)
    cfg.fxp_fraction_bits = bits
    return cfg


def io_for(n: int, config: Mapping[str, Any]) -> Any:
    """An Io for ``n`` parties (reused by this thread)."""
    import spu.api as api

    ios = _cache.__dict__.setdefault("ios", {})
    key = (n, *_key(config))
    io = ios.get(key)
    if io is None:
        io = ios[key] = api.Io(n, runtime_config(config))
    return io


def map_shares(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf of a list/tuple/dict structure."""
    leaves, rebuild = flatten(tree)
    return rebuild([fn(x) for x in leaves])


def flatten(tree: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The leaves of a list/tuple/dict structure, and how to rebuild it from new leaves."""
    leaves: list[Any] = []

    def walk(node: Any) -> Callable[[Any], Any]:
        if isinstance(node, (list, tuple)):
            parts = [walk(x) for x in node]
            kind = type(node)
            return lambda it: kind(p(it) for p in parts)
        if isinstance(node, dict):
            items = [(k, walk(v)) for k, v in node.items()]
            return lambda it: {k: p(it) for k, p in items}
        leaves.append(node)
        return lambda it: next(it)

    build = walk(tree)
    return leaves, lambda new: build(iter(new))


def make_shares(value: Any, n: int, config: Mapping[str, Any], *, secret: bool = True) -> list[Any]:
    """Split ``value`` (an array, a number, or a list/tuple/dict of them) into ``n`` share
    structures, one per member, each shaped like ``value``."""
    io = io_for(n, config)
    lib = libspu()
    vis = lib.Visibility.VIS_SECRET if secret else lib.Visibility.VIS_PUBLIC
    leaves, rebuild = flatten(value)
    split: list[list[SpuShare]] = []
    for leaf in leaves:
        arr = np.asarray(leaf)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"only numeric arrays can be secret-shared, got {arr.dtype}")
        parts = io.make_shares(arr, vis)
        split.append(
            [SpuShare.from_libspu(p, tuple(arr.shape), str(arr.dtype), secret) for p in parts]
        )
    return [rebuild([parts[i] for parts in split]) for i in range(n)]


def reconstruct(shares: list[Any], config: Mapping[str, Any]) -> Any:
    """Rebuild the plaintext from every member's share structure (same layout each)."""
    io = io_for(len(shares), config)
    per_member = [flatten(s)[0] for s in shares]
    _, rebuild = flatten(shares[0])
    out = []
    for leaf in zip(*per_member, strict=True):
        value = io.reconstruct([s.to_libspu() for s in leaf])
        out.append(np.asarray(value).reshape(leaf[0].shape))
    return rebuild(out)
