"""The floors mpl is compared with: raw pyzmq and raw libspu between separate processes.

Used by ``scripts/bench.py``; each role runs as its own process:

    python scripts/bench_floor.py relay FRONT BACK        # ROUTER<->ROUTER relay
    python scripts/bench_floor.py echo BACK               # a DEALER that echoes
    python scripts/bench_floor.py fanrelay FRONT BACK N   # one request to N echoes, one reply
    python scripts/bench_floor.py pull ADDR ACK N         # receives N frames, acks each
    MPL_BENCH_CURVE_SECRET=<z85> ... pull ADDR ACK N      # the same, as a CURVE server
    MPL_BENCH_CURVE_SECRET=<z85> ... relay FRONT BACK     # both ROUTERs CURVE servers
    MPL_BENCH_CURVE_SERVER=<z85> ... echo BACK            # a CURVE client of that server
    python scripts/bench_floor.py spu RANK WORLD PORTS CASE PROTOCOL FIELD N OUT

The SPU floor uses libspu directly: brpc links created once, ``spawn()`` per run, the
owners make shares, shares go over the link, ``Runtime`` + set_var/run/get_var, and every
share of the result goes to rank 0, which reconstructs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import zmq


def _curve(sock: zmq.Socket[Any]) -> zmq.Socket[Any]:
    """CURVE on ``sock`` when the environment asks for it (keys stay out of argv: ps shows
    that): a server with MPL_BENCH_CURVE_SECRET, a client of MPL_BENCH_CURVE_SERVER."""
    secret = os.environ.get("MPL_BENCH_CURVE_SECRET", "")
    server = os.environ.get("MPL_BENCH_CURVE_SERVER", "")
    if secret:
        sock.curve_server = True
        sock.curve_secretkey = secret.encode()
    elif server:
        sock.curve_serverkey = server.encode()
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    return sock


def relay(front: str, back: str) -> None:
    """The raw relay floor: a request (one frame, as mpl's messages are since wire v4) to the
    one echo and its reply back; the relay keeps the driver's envelope, as a broker keeps
    its job's, so the echo sees the request's frame alone."""
    ctx = zmq.Context()
    f, b = _curve(ctx.socket(zmq.ROUTER)), _curve(ctx.socket(zmq.ROUTER))
    f.bind(front)
    b.bind(back)
    poller = zmq.Poller()
    poller.register(f, zmq.POLLIN)
    poller.register(b, zmq.POLLIN)
    worker = driver = None
    while True:
        ready = dict(poller.poll())
        if b in ready:
            m = b.recv_multipart()  # [echo, payload]
            if m[1] == b"hi":
                worker = m[0]
            elif m[1] == b"bye":
                return
            elif driver is not None:
                f.send_multipart([driver, m[1]])
        if f in ready:
            m = f.recv_multipart()  # [driver, payload]
            driver = m[0]
            if worker is not None:  # before the echo says hi, requests are dropped
                b.send_multipart([worker, m[1]])


def fanrelay(front: str, back: str, n: int) -> None:
    """The raw fan-out floor: each request (one frame) goes to all N echoes; the N replies
    make one answer. A request's bytes are its id here (one round trip at a time)."""
    ctx = zmq.Context()
    f, b = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    f.bind(front)
    b.bind(back)
    workers: list[bytes] = []
    while len(workers) < n:
        m = b.recv_multipart()
        if m[1] == b"hi":
            workers.append(m[0])
    poller = zmq.Poller()
    poller.register(f, zmq.POLLIN)
    poller.register(b, zmq.POLLIN)
    owed: dict[bytes, list[Any]] = {}  # request -> [replies still owed, driver envelope]
    byes = 0
    while True:
        ready = dict(poller.poll())
        if b in ready:
            m = b.recv_multipart()  # [echo, payload]
            if m[1] == b"bye":
                byes += 1
                if byes == n:
                    return
                continue
            entry = owed.get(m[1])
            if entry is None:  # a request reused while it was still owed
                continue
            entry[0] -= 1
            if entry[0] == 0:
                del owed[m[1]]
                f.send_multipart([entry[1], m[1]])
        if f in ready:
            m = f.recv_multipart()  # [driver, payload]
            owed[m[1]] = [n, m[0]]
            for w in workers:
                b.send_multipart([w, m[1]])


def echo(back: str) -> None:
    ctx = zmq.Context()
    s = _curve(ctx.socket(zmq.DEALER))
    s.connect(back)
    s.send(b"hi")
    while True:
        m = s.recv_multipart()
        if m[-1] == b"stop":
            s.send(b"bye")
            time.sleep(0.2)
            return
        s.send_multipart(m)


def pull(addr: str, ack: str, n: int) -> None:
    secret = os.environ.get("MPL_BENCH_CURVE_SECRET", "")  # not in argv: ps shows that
    ctx = zmq.Context()
    p, a = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    if secret:  # CURVE on the data socket: the floor for mpl's secure moves
        p.curve_server = True
        p.curve_secretkey = secret.encode()
    p.bind(addr)
    a.connect(ack)
    for _ in range(n):
        frame = p.recv(copy=False)
        a.send(str(len(frame.buffer)).encode())
    time.sleep(0.2)


def spu_party(
    rank: int, world: int, ports: list[int], case: str, protocol: str, field: str, n: int, out: str
) -> None:
    os.environ.setdefault("JAX_ENABLE_X64", "1")
    import numpy as np
    import spu.api as api
    import spu.libspu as lib
    import spu.utils.frontend as fe

    opts = lib.logging.LogOptions()
    opts.enable_console_logger = False
    opts.system_log_path = "/dev/null"
    lib.logging.setup_logging(opts)
    cfg = lib.RuntimeConfig(getattr(lib.ProtocolKind, protocol), getattr(lib.FieldType, field), 18)
    io = api.Io(world, cfg)
    if case == "millionaire":
        fn: Any = lambda a, b: a < b  # noqa: E731
        make: Callable[[int], Any] = lambda r: np.asarray(3_000_000 + 2_000_000 * r)  # noqa: E731
    else:
        fn = lambda a, b: a @ b  # noqa: E731
        make = lambda r: np.random.default_rng(r).random((100, 100))  # noqa: E731
    owners = [0, world - 1]  # input a on rank 0, input b on the last rank
    vis = [lib.Visibility.VIS_SECRET] * 2
    exe, _ = fe.compile(
        fe.Kind.JAX,
        fn,
        [make(0), make(1)],
        {},
        ["a", "b"],
        vis,
        lambda outs: [f"o{i}" for i in range(len(outs))],
    )
    desc = lib.link.Desc()
    desc.recv_timeout_ms = 60_000
    for r, port in enumerate(ports):
        desc.add_party(f"p{r}", f"127.0.0.1:{port}")
    link = lib.link.create_brpc(desc, rank)
    times: list[float] = []
    for i in range(n + 3):
        link.barrier()
        t0 = time.perf_counter()
        sub = link.spawn()
        inputs: list[Any] = [None, None]
        for slot, owner in enumerate(owners):
            if owner == rank:
                shares = io.make_shares(make(slot), lib.Visibility.VIS_SECRET)
                for peer in range(world):
                    if peer != rank:
                        sub.send_async(peer, _pack(shares[peer]))
                inputs[slot] = shares[rank]
            else:
                inputs[slot] = _unpack(lib, sub.recv(owner))
        runtime = api.Runtime(sub, cfg)
        runtime.set_var("a", inputs[0])
        runtime.set_var("b", inputs[1])
        runtime.run(exe)
        share = runtime.get_var(exe.output_names[0])
        if rank == 0:
            parts = [share] + [_unpack(lib, sub.recv(peer)) for peer in range(1, world)]
            io.reconstruct(parts)
        else:
            sub.send_async(0, _pack(share))
        if i >= 3:
            times.append(time.perf_counter() - t0)
    link.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    link.stop_link()


def _pack(share: Any) -> bytes:
    parts = [share.meta, *share.share_chunks]
    head = len(parts).to_bytes(4, "little") + b"".join(len(p).to_bytes(8, "little") for p in parts)
    return head + b"".join(parts)


def _unpack(lib: Any, data: bytes) -> Any:
    n = int.from_bytes(data[:4], "little")
    sizes = [int.from_bytes(data[4 + 8 * i : 12 + 8 * i], "little") for i in range(n)]
    pos, parts = 4 + 8 * n, []
    for size in sizes:
        parts.append(data[pos : pos + size])
        pos += size
    share = lib.Share()
    share.meta = parts[0]
    share.share_chunks = parts[1:]
    return share


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "relay":
        relay(*args)
    elif role == "echo":
        echo(*args)
    elif role == "fanrelay":
        fanrelay(args[0], args[1], int(args[2]))
    elif role == "pull":
        pull(args[0], args[1], int(args[2]))
    elif role == "spu":
        spu_party(
            int(args[0]),
            int(args[1]),
            [int(p) for p in args[2].split(",")],
            args[3],
            args[4],
            args[5],
            int(args[6]),
            args[7],
        )
    else:
        sys.exit(f"unknown role {role}")
