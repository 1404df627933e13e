"""SPU devices from the driver: run under MPC, seal, reveal, place and fetch secrets.

The driver never compiles: it records an ``spu.run`` op and the SPU members compile the
function for the actual inputs (see ``mpl.worker.spu_kernels``). Host arrays given to an SPU
function become public inputs; other host values (numbers, strings, shapes) are constants
of the compiled program. The driver imports ``spu`` only to make or rebuild shares, for
``mp.put`` of a host value on an SPU and for ``mp.fetch`` of a secret.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mpl.driver.recorder import Recorder, call_template, emit
from mpl.driver.values import Value
from mpl.wire.cluster import ClusterSpec, Device
from mpl.wire.errors import DeviceError

if TYPE_CHECKING:
    from mpl.driver.context import Context

__all__ = ["fetch", "getitem", "put_host", "reveal", "run", "seal"]


def _members(cluster: ClusterSpec, dev: Device) -> tuple[int, ...]:
    return cluster.ranks(dev.name)  # in member order: member i is the SPU's local rank i


def _config(cluster: ClusterSpec, dev: Device) -> dict[str, Any]:
    cfg = cluster.spu_config(dev.name)
    return {
        "protocol": cfg.protocol,
        "field": cfg.field,
        "fxp_fraction_bits": cfg.fxp_fraction_bits,
    }


def _is_array(x: Any) -> bool:
    return type(x).__name__ in ("ndarray", "Array", "ArrayImpl") and type(x).__module__.startswith(
        ("numpy", "jax", "jaxlib")
    )


def run(
    cluster: ClusterSpec,
    dev: Device,
    fn: Callable[..., Any],
    leaves: list[Any],
    treedef: Any,
    nout: int | None,
) -> list[Value]:
    """Record ``fn`` under MPC on ``dev`` (sealing PPU-held arguments first)."""
    from mpl.driver.devices import move

    members, config = _members(cluster, dev), _config(cluster, dev)
    name = str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "fn"))

    def build(rec: Recorder) -> list[tuple[int, str | None]]:
        inputs, targs, tkwargs = call_template(
            leaves,
            treedef,
            lambda v: move(rec, v, dev.name),  # PPU-held values are sealed
            lambda x: rec.host(x, members) if _is_array(x) else None,  # public input, or constant
        )
        outs = rec.op(
            "spu.run",
            inputs,
            ranks=members,
            nout=1 if nout is None else nout,
            fn=rec.fn(fn),
            args=targs,
            kwargs=tkwargs,
            device=dev.name,
            members=members,
            config=config,
            name=name,
        )
        return [(o, dev.name) for o in outs]

    return emit(build, name=name)


def seal(rec: Recorder, sym: int, value: Value, dev: Device) -> int:
    """The owner secret-shares ``value`` onto ``dev``: one share to each member."""
    if len(value.parties) != 1:
        raise DeviceError(
            f"only a value held by one party can be sealed onto {dev.name}; "
            f"{value!r} is held by {value.parties}"
        )
    members = _members(rec.cluster, dev)
    return rec.op(
        "spu.seal",
        [sym],
        ranks=(*members, value.parties[0]),
        device=dev.name,
        members=members,
        config=_config(rec.cluster, dev),
    )[0]


def reveal(rec: Recorder, sym: int, value: Value, rank: int) -> int:
    """Every member of ``value``'s SPU sends its share to ``rank``, which reconstructs."""
    assert value.device is not None
    dev = rec.cluster.device(value.device)
    members = _members(rec.cluster, dev)
    return rec.op(
        "spu.reveal",
        [sym],
        ranks=(*members, rank),
        to=rank,
        device=dev.name,
        members=members,
        config=_config(rec.cluster, dev),
    )[0]


def put_host(cluster: ClusterSpec, dev: Device, x: Any) -> Value:
    """The driver shares ``x`` and binds one share to each member (only shares leave here)."""
    from mpl.wire.shares import make_shares

    members = _members(cluster, dev)
    shares = make_shares(x, len(members), _config(cluster, dev))
    return emit(
        lambda rec: [(rec.host_each(dict(zip(members, shares, strict=True))), dev.name)],
        name=f"put {dev.name}",
    )[0]


def getitem(value: Value, key: Any) -> Value:
    """``value[key]`` for a secret: computed under MPC, stays secret."""
    from mpl.driver.devices import device

    result: Value = device(value.device)(operator.getitem)(value, key)
    return result


def fetch(ctx: Context, value: Value, timeout: float | None) -> Any:
    """Rebuild a secret at the driver from every member's share: this REVEALS it to the
    driver (whoever runs it learns the plaintext)."""
    from mpl.wire.shares import reconstruct

    assert value.device is not None
    dev = ctx.cluster.device(value.device)
    shares = [ctx.fetch_raw(r, value._uri, timeout=timeout) for r in _members(ctx.cluster, dev)]
    return reconstruct(shares, _config(ctx.cluster, dev))
