"""SPU ops on a worker: seal, run under MPC, reveal.

* ``spu.seal``: the owner secret-shares its value and sends each member its share.
* ``spu.run``: every member compiles the JAX function for the actual input shapes, dtypes
  and visibilities (cached by program, op and inputs: once per key, not per call) and runs
  it with libspu over this op's own link (``spu_link.py``).
* ``spu.reveal``: every member sends its share to the target, which reconstructs.

The ``spu`` package (and jax) is imported by the first SPU op, not when the worker starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from mpl.wire.graph import Graph, Op, fill
from mpl.worker.interpreter import ABSENT, JobContext, kernel, split_outputs
from mpl.worker.spu_link import SpuLinks, link_id

__all__ = ["SpuService"]

log = logging.getLogger("mpl.worker")
_COMPILE_CACHE = 256


@kernel("spu.seal")
def _seal(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    from mpl.wire.shares import make_shares

    members: tuple[int, ...] = op.attrs["members"]
    owner = _owner(graph, k)
    if ctx.rank == owner:
        shares = make_shares(args[0], len(members), op.attrs["config"])
        mine: Any = ABSENT
        for j, member in enumerate(members):
            if member == ctx.rank:
                mine = shares[j]
            else:
                ctx.send(member, k, j, shares[j])
        return [mine]
    return [ctx.recv(owner, k, members.index(ctx.rank))]


def _owner(graph: Graph, k: int) -> int:
    """The rank holding the input of op ``k`` (the checker made sure there is one)."""
    op = graph.ops[k]
    value = op.inputs[0]
    return graph.placements[value][0]


@kernel("spu.reveal")
def _reveal(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    from mpl.wire.shares import reconstruct

    members: tuple[int, ...] = op.attrs["members"]
    to: int = op.attrs["to"]
    if ctx.rank != to:
        ctx.send(to, k, members.index(ctx.rank), args[0])
        return [ABSENT]
    shares = [
        args[0] if member == to else ctx.recv(member, k, j) for j, member in enumerate(members)
    ]
    return [reconstruct(shares, op.attrs["config"])]


@kernel("spu.run")
def _run(ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
    service: SpuService = ctx.extension("spu")
    return service.run(ctx, graph, k, op, args)


class SpuService:
    """Per-worker SPU state: the compile cache and its counters; links come from ``links``."""

    def __init__(self, links: SpuLinks, log_dir: Path | None = None) -> None:
        self.links = links
        self._compiled: OrderedDict[Any, tuple[Any, Any, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0
        self.cache_hits = 0
        self.runs = 0
        _quiet_logs(log_dir)

    def stats(self) -> dict[str, int]:
        return {
            "spu_compiles": self.compiles,
            "spu_cache_hits": self.cache_hits,
            "spu_runs": self.runs,
        }

    def run(self, ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
        import numpy as np
        import spu.api as api

        from mpl.wire.shares import SpuShare, flatten, libspu, runtime_config

        lib = libspu()
        members: tuple[int, ...] = op.attrs["members"]
        local = members.index(ctx.rank)
        config = op.attrs["config"]
        layout: list[tuple[int, Any]] = []  # per op input: (how many leaves, how to rebuild)
        shares: list[Any] = []
        specs: list[tuple[tuple[int, ...], str, bool]] = []
        public_io = None
        for arg in args:
            leaves, rebuild = flatten(arg)
            layout.append((len(leaves), rebuild))
            for leaf in leaves:
                if isinstance(leaf, SpuShare):
                    shares.append(leaf.to_libspu())
                    specs.append((leaf.shape, leaf.dtype, leaf.secret))
                    continue
                arr = np.asarray(leaf)  # a host value: a public input every member builds alike
                public_io = public_io or api.Io(len(members), runtime_config(config))
                shares.append(public_io.make_shares(arr, lib.Visibility.VIS_PUBLIC)[local])
                specs.append((tuple(arr.shape), str(arr.dtype), False))
        exe, out_specs, out_rebuild = self._compile(graph, k, op, layout, specs)
        link = self._link(ctx, k, members, local)
        try:
            runtime = api.Runtime(link, runtime_config(config))
            for name, share in zip(exe.input_names, shares, strict=True):
                runtime.set_var(name, share)
            runtime.run(exe)
            outs = [
                SpuShare.from_libspu(runtime.get_var(name), shape, dtype)
                for name, (shape, dtype) in zip(exe.output_names, out_specs, strict=True)
            ]
        finally:
            self.runs += 1
        return split_outputs(out_rebuild(outs), op.nout)

    def _compile(
        self,
        graph: Graph,
        k: int,
        op: Op,
        layout: list[tuple[int, Any]],
        specs: list[tuple[tuple[int, ...], str, bool]],
    ) -> tuple[Any, Any, Any]:
        key = (graph.digest, k, tuple(specs))
        with self._lock:
            hit = self._compiled.get(key)
            if hit is not None:
                self._compiled.move_to_end(key)
                self.cache_hits += 1
                return hit
        import jax
        import numpy as np
        import spu.utils.frontend as fe

        from mpl.wire.shares import libspu

        lib = libspu()
        fn = graph.fns[op.attrs["fn"]]
        template_args = op.attrs.get("args", ())
        template_kwargs = op.attrs.get("kwargs", {})

        def flat_fn(*xs: Any) -> Any:
            it = iter(xs)
            values = [rebuild([next(it) for _ in range(count)]) for count, rebuild in layout]
            return fn(*fill(template_args, values), **fill(template_kwargs, values))

        spec_of: Any = jax.ShapeDtypeStruct
        examples = [spec_of(shape, np.dtype(dtype)) for shape, dtype, _ in specs]
        vis = [lib.Visibility.VIS_SECRET if s else lib.Visibility.VIS_PUBLIC for _, _, s in specs]
        exe, out_tree = fe.compile(
            fe.Kind.JAX,
            flat_fn,
            examples,
            {},
            [f"in{i}" for i in range(len(specs))],
            vis,
            lambda outs: [f"out{i}" for i in range(len(outs))],
        )
        out_leaves, treedef = jax.tree_util.tree_flatten(out_tree)
        out_specs = [(tuple(s.shape), str(np.dtype(s.dtype))) for s in out_leaves]

        def rebuild_out(values: list[Any]) -> Any:
            return jax.tree_util.tree_unflatten(treedef, values)

        entry = (exe, out_specs, rebuild_out)
        with self._lock:
            self.compiles += 1
            self._compiled[key] = entry
            while len(self._compiled) > _COMPILE_CACHE:
                self._compiled.popitem(last=False)
        return entry

    def _link(self, ctx: JobContext, k: int, members: tuple[int, ...], local: int) -> Any:
        from mpl.wire.shares import libspu

        lib = libspu()
        desc = lib.link.Desc()
        for member in members:
            desc.add_party(f"r{member}", f"mpl-{member}")  # addresses unused: our channels carry it
        desc.recv_timeout_ms = max(1000, int((ctx.deadline - time.monotonic()) * 1000))
        name = link_id(ctx.session, ctx.job, k)
        channel_class = _channel_class()
        channels = [
            None if m == ctx.rank else channel_class(self.links, name, m, ctx.deadline)
            for m in members
        ]
        return lib.link.create_with_channels(desc, local, channels)


_CHANNEL: Any = None


def _channel_class() -> Any:
    """The IChannel subclass (defined on first use: subclassing needs libspu loaded)."""
    global _CHANNEL
    if _CHANNEL is not None:
        return _CHANNEL
    from mpl.wire.shares import libspu

    base: Any = libspu().link.IChannel

    class Channel(base):  # type: ignore[misc]
        """One direction pair with one member, for one link."""

        def __init__(self, links: SpuLinks, link: str, peer: int, deadline: float) -> None:
            super().__init__()
            self.links, self.link, self.peer, self.deadline = links, link, peer, deadline

        def Send(self, key: str, data: bytes) -> None:
            self.links.send(self.peer, self.link, key, data)

        def SendAsync(self, key: str, data: bytes) -> None:
            self.links.send(self.peer, self.link, key, data)

        def SendAsyncThrottled(self, key: str, data: bytes) -> None:
            self.links.send(self.peer, self.link, key, data)

        def Recv(self, key: str) -> bytes:
            return self.links.recv(self.link, self.peer, key, self.deadline)

        def TestSend(self, timeout: int) -> None:
            self.Send("__test__", b"\x00")

        def TestRecv(self) -> None:
            self.Recv("__test__")

        def WaitLinkTaskFinish(self) -> None:
            pass

        def Abort(self) -> None:
            pass

        def SetThrottleWindowSize(self, size: int) -> None:
            pass

        def SetChunkParallelSendSize(self, size: int) -> None:
            pass

        def SetRecvTimeout(self, timeout_ms: int) -> None:
            pass  # our deadline is the job's

        def GetRecvTimeout(self) -> int:
            return max(0, int((self.deadline - time.monotonic()) * 1000))

    _CHANNEL = Channel
    return Channel


def _quiet_logs(log_dir: Path | None) -> None:
    """libspu logs to stdout and brpc to stderr unless told otherwise: send both to a file."""
    from mpl.wire.shares import libspu

    lib = libspu()
    options = lib.logging.LogOptions()
    options.enable_console_logger = False
    options.system_log_path = str(log_dir / "spu.log") if log_dir else "/dev/null"
    options.log_level = lib.logging.LogLevel.WARN
    try:
        lib.logging.setup_logging(options)
    except Exception:  # logging is best effort; a read-only data root must not stop MPC
        log.warning("could not set up SPU logging under %s", log_dir)
