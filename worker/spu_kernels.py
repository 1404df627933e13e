"""SPU ops on a worker: seal, run under MPC, reveal.

* ``spu.seal``: the owner secret-shares its value and sends each member its share.
* ``spu.run``: every member compiles the JAX function for the actual input shapes, dtypes
  and visibilities (cached by program, op and inputs: once per key, not per call) and runs
  it with libspu over the session's lane for the device (``spu_link.py``). The function
  sees its inputs in JAX's canonical dtypes, as in spu's simulator (``spu_dtypes.py``).
* ``spu.reveal``: every member sends its share to the target, which reconstructs.

The ``spu`` package (and jax) is imported by the first SPU op, not when the worker starts.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mpl.wire.control import PeerInfo
from mpl.wire.errors import GraphError
from mpl.wire.graph import Graph, Op, fill
from mpl.wire.lru import LRU
from mpl.worker.interpreter import ABSENT, JobContext, kernel, split_outputs
from mpl.worker.kernel_table import SPU_LOG
from mpl.worker.spu_dtypes import canonical_dtypes, compile_scope, with_canonical_inputs
from mpl.worker.spu_link import SpuLinks

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


class _Lane:
    """One libspu link and Runtime kept by this member for a session's SPU device."""

    def __init__(self, lane_id: str) -> None:
        self.id = lane_id
        self.link: Any = None
        self.runtime: Any = None
        self.job: tuple[str, str] = ("", "")  # the job using the lane now (for aborts)
        self.deadline = 0.0


class SpuService:
    """Per-worker SPU state: lanes (links and Runtimes reused job after job), the compile
    cache, and their counters.

    Lanes make a run cheap: no link handshake and no collective Runtime set-up per job
    (CHEETAH's set-up alone takes hundreds of milliseconds). Members must agree on which
    lane a job uses, so a lane is dropped everywhere at the same point: when a job with SPU
    ops fails or is aborted (every member learns that from the broker), or when the session
    closes. The lane id counts those drops and names the members' incarnations, so a
    restarted member also gets a fresh lane on every side.
    """

    def __init__(
        self,
        links: SpuLinks,
        directory: Callable[[], dict[int, PeerInfo]],
        failures: Callable[[str], int],
        devices: Callable[[str], Mapping[str, tuple[int, ...]]],
        log_dir: Path | None = None,
    ) -> None:
        self.links = links
        self._directory = directory
        self._failures = failures  # per session: failed SPU jobs so far (kept by Jobs)
        # per session: its spec's SPU devices and their members' ranks (SessionRuntimes)
        self._devices = devices
        self._compiled: LRU[Any, tuple[Any, Any, Any]] = LRU(_COMPILE_CACHE)
        self._lanes: dict[tuple[Any, ...], _Lane] = {}
        self._lock = threading.Lock()
        self.compiles = 0
        self.cache_hits = 0
        self.runs = 0
        self.lanes_made = 0
        _quiet_logs(log_dir)

    def stats(self) -> dict[str, int]:
        mailbox = self.links.mailbox
        return {
            "spu_compiles": self.compiles,
            "spu_cache_hits": self.cache_hits,
            "spu_runs": self.runs,
            "spu_lanes": self.lanes_made,
            # for lanes never opened or already dropped, or beyond the mailbox's bounds
            "spu_messages_dropped": mailbox.dropped,
            "spu_messages_pending": mailbox.pending()[0],
        }

    # -- lanes ----------------------------------------------------------------------------
    def drop_lanes(self, session: str) -> None:
        """Forget the session's lanes: a job that used them failed, or the session closed."""
        with self._lock:
            dropped = [self._lanes.pop(k) for k in [k for k in self._lanes if k[0] == session]]
        for lane in dropped:
            self.links.drop_lane(lane.id)

    def _lane(
        self, ctx: JobContext, device: str, members: tuple[int, ...], local: int, config: Any
    ) -> _Lane:
        import hashlib

        import spu.api as api

        from mpl.wire.shares import libspu, runtime_config

        directory = self._directory()
        incarnations = tuple(directory[m].incarnation if m in directory else "?" for m in members)
        key = (ctx.session, device, members, incarnations)
        with self._lock:
            lane = self._lanes.get(key)
            if lane is not None:
                return lane
        # a lane only for a device of the session's spec, with its members: a name the
        # driver made up would be a lane kept per name for the session's life (R33-4).
        # Asked here, once per lane made, so a job over a lane already made pays nothing.
        _check_device(self._devices(ctx.session), device, members)
        with self._lock:
            tag = hashlib.sha1("/".join(incarnations).encode()).hexdigest()[:8]
            lane = _Lane(f"{ctx.session}/{device}/{tag}/{self._failures(ctx.session)}")
        self.links.open_lane(lane.id)  # peers' messages for it are welcome now
        lib = libspu()
        desc = lib.link.Desc()
        for member in members:
            desc.add_party(f"r{member}", f"mpl-{member}")  # addresses unused: our channels carry it
        desc.recv_timeout_ms = max(1000, int((ctx.deadline - time.monotonic()) * 1000))
        lane.job, lane.deadline = (ctx.session, ctx.job), ctx.deadline
        channel_class = _channel_class()
        channels = [None if m == ctx.rank else channel_class(self.links, lane, m) for m in members]
        lane.link = lib.link.create_with_channels(desc, local, channels)
        lane.runtime = api.Runtime(lane.link, runtime_config(config))
        with self._lock:
            self._lanes[key] = lane
            self.lanes_made += 1
        return lane

    # -- running --------------------------------------------------------------------------
    def run(self, ctx: JobContext, graph: Graph, k: int, op: Op, args: list[Any]) -> list[Any]:
        import numpy as np

        from mpl.wire.shares import SpuShare, flatten, io_for, libspu

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
                public_io = public_io or io_for(len(members), config)
                shares.append(public_io.make_shares(arr, lib.Visibility.VIS_PUBLIC)[local])
                specs.append((tuple(arr.shape), str(arr.dtype), False))
        exe, out_specs, out_rebuild = self._compile(graph, k, op, layout, specs)
        try:
            lane = self._lane(ctx, op.attrs["device"], members, local, config)
            lane.job, lane.deadline = (ctx.session, ctx.job), ctx.deadline
            runtime = lane.runtime
            for name, share in zip(exe.input_names, shares, strict=True):
                runtime.set_var(name, share)
            runtime.run(exe)
            outs = [
                SpuShare.from_libspu(runtime.get_var(name), shape, dtype)
                for name, (shape, dtype) in zip(exe.output_names, out_specs, strict=True)
            ]
            for name in (*exe.input_names, *exe.output_names):
                runtime.del_var(name)
        except BaseException:
            self.drop_lanes(ctx.session)  # the lane's state is unknown now; the job fails
            raise
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
        actual = [dtype for _, dtype, _ in specs]
        canonical = canonical_dtypes(actual)
        key = (graph.digest, k, tuple(specs), canonical)
        with self._lock:
            hit = self._compiled.touch(key)
            if hit is not None:
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
        vis = [lib.Visibility.VIS_SECRET if s else lib.Visibility.VIS_PUBLIC for _, _, s in specs]
        # Shares keep their maker's dtype; the function sees JAX's canonical one (spu_dtypes).
        program = with_canonical_inputs(flat_fn, actual, canonical)
        # One compile at a time per process: in the Simulator every member is a thread of
        # this process, and spu's frontend and JAX's tracing caches are not documented as
        # safe to enter from two threads at once. spu's compile cache is locked for every
        # caller, not only mpl's (wire/spu_compile_cache.py). A daemon has one member.
        with _COMPILE_LOCK, compile_scope(actual, canonical):
            examples = [spec_of(shape, np.dtype(dtype)) for shape, dtype, _ in specs]
            exe, out_tree = fe.compile(
                fe.Kind.JAX,
                program,
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
        if not self.compiles:
            gc.freeze()  # jax is loaded now: keep the collector off its many module objects
        with self._lock:
            self.compiles += 1
            self._compiled[key] = entry
        return entry


def _check_device(devices: Mapping[str, tuple[int, ...]], device: str, members: Any) -> None:
    """Refuse an SPU op whose device is not one of ``devices`` with exactly its members."""
    known = devices.get(device)
    if known is not None and tuple(members) == known:
        return
    shown = device if len(device) <= 64 else device[:64] + "..."
    if known is None:
        names = ", ".join(sorted(devices)[:8]) or "none"
        why = f"is not an SPU device of this session's cluster spec (its SPU devices: {names})"
    else:
        why = f"has members {list(known)} in this session's cluster spec, not {list(members)}"
    raise GraphError(f"SPU device {shown!r} {why}")


_CHANNEL: Any = None
_COMPILE_LOCK = threading.Lock()


def _channel_class() -> Any:
    """The IChannel subclass (defined on first use: subclassing needs libspu loaded)."""
    global _CHANNEL
    if _CHANNEL is not None:
        return _CHANNEL
    from mpl.wire.shares import libspu

    base: Any = libspu().link.IChannel

    class Channel(base):  # type: ignore[misc]
        """One direction pair with one member, for one link."""

        def __init__(self, links: SpuLinks, lane: _Lane, peer: int) -> None:
            super().__init__()
            self.links, self.lane, self.peer = links, lane, peer

        def Send(self, key: str, data: bytes) -> None:
            lane = self.lane
            self.links.send(self.peer, lane.id, key, data, lane.job, lane.deadline)

        def SendAsync(self, key: str, data: bytes) -> None:
            lane = self.lane
            self.links.send(self.peer, lane.id, key, data, lane.job, lane.deadline)

        def SendAsyncThrottled(self, key: str, data: bytes) -> None:
            lane = self.lane
            self.links.send(self.peer, lane.id, key, data, lane.job, lane.deadline)

        def Recv(self, key: str) -> bytes:
            lane = self.lane
            return self.links.recv(lane.id, self.peer, key, lane.job, lane.deadline)

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
            return max(0, int((self.lane.deadline - time.monotonic()) * 1000))

    _CHANNEL = Channel
    return Channel


def _quiet_logs(log_dir: Path | None) -> None:
    """libspu logs to stdout and brpc to stderr unless told otherwise: send both to a file."""
    from mpl.wire.shares import libspu

    lib = libspu()
    options = lib.logging.LogOptions()
    options.enable_console_logger = False
    options.system_log_path = str(log_dir / SPU_LOG) if log_dir else "/dev/null"
    options.log_level = lib.logging.LogLevel.WARN
    try:
        lib.logging.setup_logging(options)
    except Exception:  # logging is best effort; a read-only data root must not stop MPC
        log.warning("could not set up SPU logging under %s", log_dir)
