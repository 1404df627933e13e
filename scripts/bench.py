#!/usr/bin/env python
"""mpl benchmarks: prints a table and writes JSON with the reference harness's row format.

    .venv/bin/python scripts/bench.py                    # every phase
    .venv/bin/python scripts/bench.py --phases codec     # a subset
    .venv/bin/python scripts/bench.py --json out.json

Rows look like the reference harness's (``../shared/bench/anchor_mplang``): phase, metric,
unit, n, median, min, max, plus extras, and metric names match where the same thing is
measured, so both JSON files line up. Phases:

  codec      encode+decode of a 64 MiB float64 array and of a small header-only message
  floor      raw pyzmq: relayed round trip; 64 MiB PUSH->PULL between processes
  spu-floor  raw libspu over brpc between processes: millionaire, 100x100 matmul (+ reveal)
  dist       real daemons: trivial job + fetch (2p, 3p), P0->P1 64 MiB move
  spu        real daemons: millionaire and matmul, sealed, run and revealed in one job
  import     `import mpl.driver` in a fresh process
  startup    broker + 2 workers until ready; idle worker RSS
  secure     (--secure) plaintext vs secure (CurveZMQ + end-to-end sealing) daemons in one
             sitting: trivial job + fetch, 64 MiB P0->P1 move, 64 MiB fetch to the driver,
             raw CURVE PUSH/PULL floor, secure connect-to-first-job, sealing alone
  pipeline   trivial jobs per second with 1, 8, 64 in flight (mp.submit) vs a raw pyzmq relay
             keeping the same window of round trips in flight
  fanout     trivial pcall on all ranks + fetch, world 2..32, vs a raw pyzmq relay fanning
             out to as many echo processes; cost per added rank
  eager      eager move + call (P0 -> P1) per call; the driver's own cost of an eager call
             and of an @mp.function cache hit (the round trip replaced by a canned answer)
  cpu        CPU per trivial job in each process (driver, broker, workers) vs the raw relay
  soak       10,000 small jobs with a move: daemons' RSS and table sizes before and after;
             peak RSS of a 1 GiB P0->P1 move on both ends (scripts/bench_soak.py)

Rows measured against a floor carry it (`floor`, same unit) and the table prints the ratio
mpl / floor (for rates, above 1 is better; for times, below).

--reference FILE prints the reference harness's rows (results.json) beside ours.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROWS: list[dict[str, Any]] = []


def summarize(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def record(phase: str, metric: str, xs: list[float], unit: str = "s", **extra: Any) -> None:
    row = {"phase": phase, "metric": metric, "unit": unit, **summarize(xs), **extra}
    ROWS.append(row)
    print(
        f"[{phase}] {metric}: {fmt(row['median'], unit)} (min {fmt(row['min'], unit)}, "
        f"max {fmt(row['max'], unit)}, n={row['n']})",
        flush=True,
    )


def measure(fn: Callable[[], Any], reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        if value < 1e-3:
            return f"{value * 1e6:.1f} µs"
        if value < 1:
            return f"{value * 1e3:.3f} ms"
        return f"{value:.3f} s"
    if unit in ("MB/s", "jobs/s"):
        return f"{value:.0f} {unit}"
    return f"{value:.4g} {unit}"


# -- phases --------------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1024 * 1024


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, os.path.join(HERE, "bench_floor.py"), *args])


def percentiles(xs: list[float]) -> dict[str, float]:
    ys = sorted(xs)
    return {"p50": ys[len(ys) // 2], "p99": ys[min(len(ys) - 1, int(len(ys) * 0.99))]}


def phase_codec() -> None:
    import numpy as np

    from mpl.wire import decode, encode
    from mpl.wire.control import Heartbeat
    from mpl.wire.jobs import Lit

    big = Lit(np.ones(8 * MIB, dtype=np.float64))  # 64 MiB
    record("codec", "encode+decode 64 MiB float64 array", measure(lambda: decode(encode(big)), 50))
    small = Heartbeat({"objects": 3, "bytes_in": 1024})
    record(
        "codec",
        "encode+decode small header-only message",
        measure(lambda: decode(encode(small)), 20000, warmup=100),
    )


def phase_floor() -> None:
    """Raw pyzmq: a relayed round trip, and a 64 MiB PUSH->PULL between two processes."""
    import zmq

    front, back = (f"tcp://127.0.0.1:{p}" for p in free_ports(2))
    procs = [spawn("relay", front, back), spawn("echo", back)]
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.linger = 0
    d.connect(front)
    time.sleep(0.5)  # let the echo register with the relay (a bench, not a test)

    def rt() -> None:
        d.send_multipart([b"MPL\x01", b"x" * 40])
        d.recv_multipart()

    xs = measure(rt, 2000, warmup=200)
    record("floor", "raw pyzmq driver->relay->worker round trip", xs, **percentiles(xs))
    d.send_multipart([b"stop"])
    for p in procs:
        p.wait(10)
    record(
        "floor", "raw pyzmq PUSH->PULL 64 MiB", [_raw_move(ctx, 64) for _ in range(10)], unit="MB/s"
    )
    d.close()
    ctx.term()


def _raw_move(ctx: Any, mib: int, curve: bool = False) -> float:
    import numpy as np
    import zmq

    data_port, ack_port = free_ports(2)
    ack = ctx.socket(zmq.PULL)
    ack.bind(f"tcp://127.0.0.1:{ack_port}")
    env = None
    push = ctx.socket(zmq.PUSH)
    if curve:  # CURVE on both ends, fresh throw-away keys
        server_public, server_secret = zmq.curve_keypair()
        env = {**os.environ, "MPL_BENCH_CURVE_SECRET": server_secret.decode()}
        push.curve_serverkey = server_public
        push.curve_publickey, push.curve_secretkey = zmq.curve_keypair()
    data, acks = f"tcp://127.0.0.1:{data_port}", f"tcp://127.0.0.1:{ack_port}"
    script = os.path.join(HERE, "bench_floor.py")
    proc = subprocess.Popen([sys.executable, script, "pull", data, acks, "2"], env=env)
    push.linger = 1000
    push.connect(f"tcp://127.0.0.1:{data_port}")
    payload = np.ones(mib * MIB // 8)
    push.send(b"warm")
    ack.recv()
    t0 = time.perf_counter()
    push.send(payload, copy=False)
    ack.recv()
    seconds = time.perf_counter() - t0
    proc.wait(10)
    push.close()
    ack.close()
    return payload.nbytes / seconds / 1e6


def _spu_floor(world: int, case: str, protocol: str, field: str, n: int = 20) -> list[float]:
    ports = ",".join(map(str, free_ports(world)))
    out = os.path.join(tempfile.mkdtemp(prefix="mpl-bench-"), "times.json")
    procs = [
        spawn("spu", str(r), str(world), ports, case, protocol, field, str(n), out)
        for r in range(world)
    ]
    for p in procs:
        p.wait(600)
    with open(out) as f:
        times: list[float] = json.load(f)
    return times


def phase_spu_floor() -> None:
    """Raw libspu between separate processes (brpc, spawn per run): the SPU floor."""
    for world, protocol, field in ((2, "SEMI2K", "FM128"), (3, "ABY3", "FM64")):
        record(
            "floor",
            f"raw libspu {protocol} {world}p millionaire + reveal",
            _spu_floor(world, "millionaire", protocol, field),
        )
        record(
            "floor",
            f"raw libspu {protocol} {world}p 100x100 f64 matmul + reveal",
            _spu_floor(world, "matmul", protocol, field),
        )


def _cluster(world: int, protocol: str = "SEMI2K", field: str = "FM128") -> Any:
    import mpl.driver as mp

    return mp.local_cluster(
        mp.ClusterSpec.simple(world, spu_protocol=protocol, spu_field=field), timeout=60.0
    )


def phase_dist() -> None:
    """Real daemons on loopback: trivial jobs, a 64 MiB move."""
    import numpy as np

    import mpl.driver as mp

    for world in (2, 3):
        with _cluster(world):
            one = mp.device("P0")(lambda: 1)
            xs = measure(lambda one=one: mp.fetch(one()), 1000, warmup=50)
            record(
                f"dist{world}",
                f"trivial job (1 pcall on P0) + fetch, {world}p",
                xs,
                **percentiles(xs),
            )

            everyone = mp.function(lambda n=world: mp.simp.pcall(tuple(range(n)), lambda: 1))
            xs = measure(lambda f=everyone: mp.fetch(f()), 1000, warmup=50)
            record(
                f"dist{world}",
                f"(i) trivial pcall-all+fetch, compiled, {world}p",
                xs,
                **percentiles(xs),
            )
            if world == 2:
                big = mp.device("P0")(lambda: np.ones(8 * MIB))()

                @mp.function
                def move(v: mp.Value) -> mp.Value:
                    return mp.put("P1", v)

                rates = []
                for _ in range(8):
                    t0 = time.perf_counter()
                    moved = move(big)
                    rates.append(64 * MIB / (time.perf_counter() - t0) / 1e6)
                    del moved
                record("dist2", "(ii) P0->P1 64 MiB f64: net transfer", rates[2:], unit="MB/s")


def phase_spu() -> None:
    """SPU through mpl on real daemons: seal, run and reveal in one job."""
    import numpy as np

    import mpl.driver as mp

    for world, protocol, field in ((2, "SEMI2K", "FM128"), (3, "ABY3", "FM64")):
        with _cluster(world, protocol, field) as ctx:
            last = f"P{world - 1}"
            a = mp.device("P0")(lambda: np.asarray(3_000_000))()
            b = mp.device(last)(lambda: np.asarray(5_000_000))()
            x = mp.device("P0")(lambda: np.random.default_rng(0).random((100, 100)))()
            y = mp.device(last)(lambda: np.random.default_rng(1).random((100, 100)))()

            @mp.function
            def millionaire(u: mp.Value, v: mp.Value) -> mp.Value:
                return mp.put("P0", mp.device("SP0")(lambda p, q: p < q)(u, v))

            @mp.function
            def matmul(u: mp.Value, v: mp.Value) -> mp.Value:
                return mp.put("P0", mp.device("SP0")(lambda p, q: p @ q)(u, v))

            record(
                f"spu{world}",
                f"(iii) SPU {protocol} {world}p millionaire (reveal to P0)",
                measure(lambda a=a, b=b: mp.fetch(millionaire(a, b)), 20, warmup=3),
            )
            record(
                f"spu{world}",
                f"(iii) SPU {protocol} {world}p 100x100 f64 matmul + reveal",
                measure(lambda x=x, y=y: mp.fetch(matmul(x, y)), 20, warmup=3),
            )
            del ctx


def phase_import() -> None:
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import mpl.driver"], check=True)
        times.append(time.perf_counter() - t0)
    record("import", "(c) fresh `python -c 'import mpl.driver'` wall", times[1:])


def phase_startup() -> None:
    from mpl.driver.launcher import ProcessCluster
    from mpl.wire import ClusterSpec

    times, rss = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        cluster = ProcessCluster(ClusterSpec.simple(2))
        times.append(time.perf_counter() - t0)
        time.sleep(1.0)  # idle a moment before reading memory
        rss += [_rss_mib(p.pid) for p in cluster.workers.values()]
        cluster.close()
    record("startup", "(c) start broker + 2 workers -> all ready", times)
    record("startup", "(c) worker RSS idle", rss, unit="MiB")


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def phase_secure() -> None:
    """Plaintext against secure daemons in the same sitting, and the raw CURVE floor."""
    import numpy as np
    import zmq

    import mpl.driver as mp
    from mpl.driver.launcher import LOCAL_DRIVER

    ctx = zmq.Context()
    for curve in (False, True):
        name = "CURVE " if curve else ""
        rates = [_raw_move(ctx, 64, curve=curve) for _ in range(6)]
        record("secure", f"raw pyzmq {name}PUSH->PULL 64 MiB", rates[1:], unit="MB/s")
    ctx.term()
    # Both clusters run at once and take turns, so load from elsewhere on a shared machine
    # falls on both alike.
    spec = mp.ClusterSpec.simple(2, enable_spu=False)
    clusters = {
        mode: mp.local_cluster(spec, timeout=60.0, secure=mode == "secure")
        for mode in ("plaintext", "secure")
    }
    try:
        times: dict[str, list[float]] = {mode: [] for mode in clusters}
        rates: dict[str, list[float]] = {mode: [] for mode in clusters}
        fetches: dict[str, list[float]] = {mode: [] for mode in clusters}
        for turn in range(6):
            for mode, cluster in clusters.items():
                mp.set_context(cluster)  # not `with`: leaving it would stop the cluster
                one = mp.device("P0")(lambda: 1)
                times[mode] += measure(lambda one=one: mp.fetch(one()), 100, warmup=10)
                big = mp.device("P0")(lambda: np.ones(8 * MIB))()
                t0 = time.perf_counter()
                moved = mp.put("P1", big)
                mp.fetch(mp.device("P1")(lambda v: v.shape)(moved))
                if turn:
                    rates[mode].append(64 * MIB / (time.perf_counter() - t0) / 1e6)
                t0 = time.perf_counter()
                mp.fetch(big)  # secure: sealed by P0 for the driver, through the broker
                if turn:
                    fetches[mode].append(64 * MIB / (time.perf_counter() - t0) / 1e6)
                del moved, big
        mp.set_context(None)
        for mode in clusters:
            xs = times[mode]
            record("secure", f"trivial job + fetch, 2p, {mode}", xs, **percentiles(xs))
            record("secure", f"P0->P1 64 MiB f64 move, {mode}", rates[mode], unit="MB/s")
            record("secure", f"64 MiB f64 fetch to driver, {mode}", fetches[mode], unit="MB/s")
        procs = clusters["secure"].processes
        key, pinned = procs.key_file(LOCAL_DRIVER), procs.cluster
        firsts = []
        for _ in range(5):
            t0 = time.perf_counter()
            with mp.connect(procs.address, key=key, cluster=pinned) as driver:
                mp.fetch(mp.device("P0")(lambda: 1)())
                firsts.append(time.perf_counter() - t0)
                driver.close()
        record("secure", "secure driver: connect to first job's result", firsts)
        _seal_cost(np)
    finally:
        for cluster in clusters.values():
            cluster.close()


# -- jobs in flight, fan-out, the eager path, CPU per job ----------------------------------


class _RawRelay:
    """Raw pyzmq relay processes (one echo, or N echoes behind a fan-out relay)."""

    def __init__(self, echoes: int = 1, fan: bool = False) -> None:
        import zmq

        front, back = (f"tcp://127.0.0.1:{p}" for p in free_ports(2))
        relay = ("fanrelay", front, back, str(echoes)) if fan else ("relay", front, back)
        self.procs = [spawn(*relay)] + [spawn("echo", back) for _ in range(echoes)]
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(front)
        deadline = time.monotonic() + 30
        for i in itertools.count():  # the echoes are registered once a request comes back
            self.sock.send_multipart([b"ping%d" % i, b"x"])
            if self.sock.poll(200):
                self.sock.recv_multipart()
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the raw relay did not come up")
        while self.sock.poll(50):  # answers to the pings sent while it was coming up
            self.sock.recv_multipart()

    def round_trip(self) -> None:
        self.sock.send_multipart([b"r", b"x" * 40])
        self.sock.recv_multipart()

    def windowed(self, total: int, window: int) -> float:
        """Round trips per second with ``window`` requests kept in flight."""
        t0 = time.perf_counter()
        sent = done = 0
        while sent < min(window, total):
            self.sock.send_multipart([b"w", b"x" * 40])
            sent += 1
        while done < total:
            self.sock.recv_multipart()
            done += 1
            if sent < total:
                self.sock.send_multipart([b"w", b"x" * 40])
                sent += 1
        return total / (time.perf_counter() - t0)

    def close(self) -> None:
        self.sock.send_multipart([b"stop"])
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.sock.close()
        self.ctx.term()


def _trivial_all(world: int) -> Any:
    import mpl.driver as mp

    return mp.function(lambda n=world: mp.simp.pcall(tuple(range(n)), lambda: 1))


def phase_pipeline() -> None:
    """Trivial jobs per second with a window of jobs in flight, against the raw relay."""
    import mpl.driver as mp

    raw = _RawRelay()
    total = {1: 1000, 8: 2000, 64: 3000}
    floors = {w: [raw.windowed(total[w], w) for _ in range(3)] for w in total}
    raw.close()
    with _cluster(2):
        job = mp.function(lambda: mp.device("P0")(lambda: 1)())
        mp.fetch(job())

        def windowed(n: int, window: int) -> float:
            t0 = time.perf_counter()
            inflight: list[Any] = []
            for _ in range(n):
                if len(inflight) >= window:
                    mp.fetch(inflight.pop(0).result())  # jobs of one session end in order
                inflight.append(mp.submit(job))
            for f in inflight:
                mp.fetch(f.result())
            return n / (time.perf_counter() - t0)

        for window, n in total.items():
            rates = [windowed(n, window) for _ in range(3)]
            floor = statistics.median(floors[window])
            record(
                "pipeline",
                f"trivial jobs/s, {window} in flight (mp.submit), 2p",
                rates,
                unit="jobs/s",
                floor=floor,
            )


def phase_fanout() -> None:
    """One job to all n ranks and n replies gathered, against a raw relay doing the same."""
    medians: dict[int, float] = {}
    for world in (2, 4, 8, 16, 32):
        reps = 400 if world <= 8 else 150
        raw = _RawRelay(world, fan=True)
        floor = measure(raw.round_trip, reps * 2, warmup=50)
        raw.close()
        import mpl.driver as mp

        with _cluster(world):
            job = _trivial_all(world)
            xs = measure(lambda job=job: mp.fetch(job()), reps, warmup=20)
        medians[world] = statistics.median(xs)
        record(
            "fanout",
            f"trivial pcall on all {world} ranks + fetch",
            xs,
            floor=statistics.median(floor),
            **percentiles(xs),
        )
    per_rank = [(medians[b] - medians[a]) / (b - a) for a, b in itertools.pairwise(sorted(medians))]
    record("fanout", "cost per added rank (between successive sizes)", per_rank)


def phase_eager() -> None:
    """Eager move + call per call, and the driver's own cost of eager and compiled calls."""
    import mpl.driver as mp
    from mpl.wire.jobs import JobResult

    raw = _RawRelay()
    floor = statistics.median(measure(raw.round_trip, 2000, warmup=200))
    raw.close()
    with _cluster(2) as ctx:
        x = mp.put("P0", 1.0)
        inc = lambda t: t + 1  # noqa: E731
        xs = measure(lambda: mp.device("P1")(inc)(x), 1000, warmup=50)
        record(
            "eager", "eager move + call (P0 -> P1), per call", xs, floor=floor, **percentiles(xs)
        )
        # past the inline size only P0 holds the data: a move between workers, then the call
        import numpy as np

        big = mp.put("P0", np.zeros(9000))
        xs = measure(lambda: mp.device("P1")(np.sum)(big), 300, warmup=20)
        record(
            "eager",
            "eager move + call of 72 kB only P0 holds (peer move), per call",
            xs,
            floor=floor,
            **percentiles(xs),
        )
        compiled = mp.function(lambda v: mp.device("P1")(inc)(v))
        compiled(x)
        real = ctx.client.submit
        ctx.client.submit = lambda *a, **kw: JobResult("bench.1")  # type: ignore[method-assign]
        try:
            record(
                "eager",
                "driver cost of an eager move + call (round trip stubbed)",
                measure(lambda: mp.device("P1")(inc)(x), 5000, warmup=200),
            )
            record(
                "eager",
                "driver cost of an @mp.function cache hit (round trip stubbed)",
                measure(lambda: compiled(x), 5000, warmup=200),
            )
        finally:
            ctx.client.submit = real  # type: ignore[method-assign]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase_cpu() -> None:
    """CPU seconds per trivial job in each process, against the raw relay's processes."""
    import mpl.driver as mp

    n = 3000
    raw = _RawRelay()
    pids = {"broker": raw.procs[0].pid, "worker": raw.procs[1].pid}
    before = {k: _cpu_s(p) for k, p in pids.items()}
    t0 = time.process_time()
    for _ in range(n):
        raw.round_trip()
    driver = time.process_time() - t0
    used = {k: _cpu_s(p) - before[k] for k, p in pids.items()}
    raw.close()
    floor = {"driver": driver / n, "broker": used["broker"] / n, "worker": used["worker"] / n}
    with _cluster(2) as ctx:
        job = _trivial_all(2)
        for _ in range(100):
            mp.fetch(job())
        procs = ctx.processes
        assert procs.broker is not None
        pids = {
            "broker": procs.broker.pid,
            **{f"worker{r}": p.pid for r, p in procs.workers.items()},
        }
        before = {k: _cpu_s(p) for k, p in pids.items()}
        t0 = time.process_time()
        for _ in range(n):
            mp.fetch(job())
        driver = time.process_time() - t0
        used = {k: _cpu_s(p) - before[k] for k, p in pids.items()}
    mine = {"driver": driver, **used}
    for name, seconds in mine.items():
        role = "worker" if name.startswith("worker") else name
        record(
            "cpu",
            f"CPU per trivial job (pcall on both ranks), {name}",
            [seconds / n],
            floor=floor[role],
        )


def _seal_cost(np: Any) -> None:
    """End-to-end sealing alone, in one process: seal then open 64 MiB, and a small value."""
    import zmq

    from mpl.wire.seal import Sealer

    (pa, sa), (pb, sb) = (tuple(k.decode() for k in zmq.curve_keypair()) for _ in range(2))
    a, b = Sealer(sa, "node:a", {"driver:b": pb}), Sealer(sb, "driver:b", {"node:a": pa})
    big = np.ones(8 * MIB)
    for what, value, reps in (("64 MiB f64", big, 5), ("small (an int)", 1, 300)):
        seal_t, open_t = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            box = a.seal(value, "driver:b", "bench")
            t1 = time.perf_counter()
            b.open(box, "bench", sender="node:a")
            seal_t.append(t1 - t0)
            open_t.append(time.perf_counter() - t1)
        if value is big:
            record("secure", f"seal {what}", [64 * MIB / t / 1e6 for t in seal_t], unit="MB/s")
            record("secure", f"open {what}", [64 * MIB / t / 1e6 for t in open_t], unit="MB/s")
        else:
            record("secure", f"seal {what}", seal_t)
            record("secure", f"open {what}", open_t)


PHASES: dict[str, Callable[[], None]] = {
    "codec": phase_codec,
    "floor": phase_floor,
    "spu-floor": phase_spu_floor,
    "dist": phase_dist,
    "spu": phase_spu,
    "import": phase_import,
    "startup": phase_startup,
    "secure": phase_secure,
    "pipeline": phase_pipeline,
    "fanout": phase_fanout,
    "eager": phase_eager,
    "cpu": phase_cpu,
    "soak": lambda: _soak(),
}


def _soak() -> None:
    sys.path.insert(0, HERE)
    from bench_soak import phase_soak

    phase_soak(record)


def table() -> str:
    lines = [
        "| phase | metric | median | p99 | min | max | n | floor | mpl / floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ROWS:
        u = r["unit"]
        p99 = fmt(r["p99"], u) if "p99" in r else ""
        floor = _value(r, "floor")
        if floor is None and (r["phase"], r["metric"]) in FLOORS:
            floor = _value(_find(ROWS, *FLOORS[r["phase"], r["metric"]]))
        shown = fmt(floor, u) if floor else "-"
        ratio = f"{r['median'] / floor:.2f}" if floor else "-"
        lines.append(
            f"| {r['phase']} | {r['metric']} | {fmt(r['median'], u)} | {p99} | "
            f"{fmt(r['min'], u)} | {fmt(r['max'], u)} | {r['n']} | {shown} | {ratio} |"
        )
    return "\n".join(lines)


# Rows of the older phases and the floor row (of the same run) each is compared with.
_RT = ("floor", "raw pyzmq driver->relay->worker round trip")
FLOORS: dict[tuple[str, str], tuple[str, str]] = {
    ("dist2", "trivial job (1 pcall on P0) + fetch, 2p"): _RT,
    ("dist2", "(i) trivial pcall-all+fetch, compiled, 2p"): _RT,
    ("dist3", "trivial job (1 pcall on P0) + fetch, 3p"): _RT,
    ("dist2", "(ii) P0->P1 64 MiB f64: net transfer"): ("floor", "raw pyzmq PUSH->PULL 64 MiB"),
}


def _find(rows: list[dict[str, Any]], phase: str, metric: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["phase"] == phase and r["metric"] == metric), None)


def _value(row: dict[str, Any] | None, key: str = "median") -> float | None:
    if row is None or key not in row or not isinstance(row[key], (int, float)):
        return None
    return float(row[key])


# (label, ours (phase, metric, key), reference (phase, metric, key), floor (phase, metric), target)
_M = "(iii) SPU SEMI2K 2p millionaire (reveal to P0)"
_MM = "(iii) SPU SEMI2K 2p 100x100 f64 matmul + reveal"
_A = "(iii) SPU ABY3 3p millionaire (reveal to P0)"
_AM = "(iii) SPU ABY3 3p 100x100 f64 matmul + reveal"
COMPARE: list[
    tuple[
        str,
        tuple[str, str, str],
        tuple[str, str, str],
        tuple[str, str] | None,
        Callable[[float, float | None], bool],
        str,
    ]
] = [
    (
        "trivial job + fetch, 2p, p50",
        ("dist2", "(i) trivial pcall-all+fetch, compiled, 2p", "median"),
        ("http2", "(i) trivial pcall-all+fetch, compiled, 2p", "median"),
        ("floor", "raw pyzmq driver->relay->worker round trip"),
        lambda v, f: v <= 0.5e-3,
        "<= 0.5 ms",
    ),
    (
        "trivial job + fetch, 2p, p99",
        ("dist2", "(i) trivial pcall-all+fetch, compiled, 2p", "p99"),
        ("http2", "", ""),
        None,
        lambda v, f: v <= 1e-3,
        "<= 1 ms",
    ),
    (
        "trivial job + fetch, 3p, p50",
        ("dist3", "(i) trivial pcall-all+fetch, compiled, 3p", "median"),
        ("http3", "(i) trivial pcall-all+fetch, compiled, 3p", "median"),
        None,
        lambda v, f: v <= 0.7e-3,
        "<= 0.7 ms",
    ),
    (
        "P0->P1 64 MiB move (MB/s)",
        ("dist2", "(ii) P0->P1 64 MiB f64: net transfer", "median"),
        ("http2", "(ii) P0->P1 64 MiB f64: net transfer", "MBps_net"),
        ("floor", "raw pyzmq PUSH->PULL 64 MiB"),
        lambda v, f: f is not None and v >= 0.8 * f,
        ">= 80% of raw PUSH/PULL",
    ),
    (
        "SPU SEMI2K/FM128 2p millionaire + reveal",
        ("spu2", _M, "median"),
        ("http2-brpc", _M, "median"),
        ("floor", "raw libspu SEMI2K 2p millionaire + reveal"),
        lambda v, f: f is not None and v <= f + 1e-3,
        "<= floor + 1 ms",
    ),
    (
        "SPU SEMI2K/FM128 2p 100x100 matmul + reveal",
        ("spu2", _MM, "median"),
        ("http2-brpc", _MM, "median"),
        ("floor", "raw libspu SEMI2K 2p 100x100 f64 matmul + reveal"),
        lambda v, f: f is not None and v <= 1.1 * f,
        "<= 1.1 x floor",
    ),
    (
        "SPU ABY3/FM64 3p millionaire + reveal",
        ("spu3", _A, "median"),
        ("http3-brpc", _A, "median"),
        ("floor", "raw libspu ABY3 3p millionaire + reveal"),
        lambda v, f: f is not None and v <= f + 1e-3,
        "<= floor + 1 ms",
    ),
    (
        "SPU ABY3/FM64 3p 100x100 matmul + reveal",
        ("spu3", _AM, "median"),
        ("http3-brpc", _AM, "median"),
        ("floor", "raw libspu ABY3 3p 100x100 f64 matmul + reveal"),
        lambda v, f: f is not None and v <= 1.1 * f,
        "<= 1.1 x floor",
    ),
    (
        "import (fresh process)",
        ("import", "(c) fresh `python -c 'import mpl.driver'` wall", "median"),
        ("import", "(c) fresh `python -c 'import mplang'` wall", "median"),
        None,
        lambda v, f: v <= 0.3,
        "<= 0.3 s",
    ),
    (
        "worker idle RSS (MiB)",
        ("startup", "(c) worker RSS idle", "median"),
        ("http2", "(c) worker rank0 RSS idle / peak (VmHWM)", "min"),
        None,
        lambda v, f: v <= 100,
        "<= 100 MiB",
    ),
    (
        "pipelined trivial jobs/s, 64 in flight, 2p",
        ("pipeline", "trivial jobs/s, 64 in flight (mp.submit), 2p", "median"),
        ("", "", ""),
        None,
        lambda v, f: f is not None and v >= 0.5 * f,
        ">= 50% of the raw relay",
    ),
    *[
        (
            f"pcall on all {n} ranks + fetch",
            ("fanout", f"trivial pcall on all {n} ranks + fetch", "median"),
            ("", "", ""),
            None,
            lambda v, f: f is not None and v <= 1.5 * f,
            "<= 1.5 x raw fan-out",
        )
        for n in (2, 4, 8, 16, 32)
    ],
    (
        "eager move + call, per call",
        ("eager", "eager move + call (P0 -> P1), per call", "median"),
        ("", "", ""),
        None,
        lambda v, f: v <= 0.7e-3,
        "<= 0.7 ms",
    ),
    (
        "@mp.function cache-hit overhead (driver)",
        ("eager", "driver cost of an @mp.function cache hit (round trip stubbed)", "median"),
        ("", "", ""),
        None,
        lambda v, f: v <= 50e-6,
        "<= 50 us",
    ),
    (
        "start broker + 2 workers until ready",
        ("startup", "(c) start broker + 2 workers -> all ready", "median"),
        ("http2", "(c) start 2 workers -> all /health OK", "median"),
        None,
        lambda v, f: v <= 0.5,
        "<= 0.5 s",
    ),
]


def summary(reference: list[dict[str, Any]]) -> str:
    lines = ["| metric | reference | floor | mpl | target | met |", "|---|---|---|---|---|---|"]
    for label, ours, ref, floor, ok, target in COMPARE:
        mine = _value(_find(ROWS, ours[0], ours[1]), ours[2])
        if mine is None:
            continue
        theirs = _value(_find(reference, ref[0], ref[1]), ref[2]) if ref[1] else None
        # rows measured against their own floor carry it; others name a floor row
        base = _value(_find(ROWS, *floor)) if floor else _value(_find(ROWS, *ours[:2]), "floor")
        unit = (
            "MB/s"
            if "MB/s" in label
            else "MiB"
            if "MiB)" in label
            else "jobs/s"
            if "jobs/s" in label
            else "s"
        )
        show = lambda v, unit=unit: fmt(v, unit) if v is not None else "-"  # noqa: E731
        lines.append(
            f"| {label} | {show(theirs)} | {show(base)} | {show(mine)} | {target} | "
            f"{'yes' if ok(mine, base) else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--phases",
        default=",".join(p for p in PHASES if p != "secure"),
        help="comma-separated phases",
    )
    ap.add_argument(
        "--secure",
        action="store_true",
        help="also run the secure phase (plaintext vs CurveZMQ in the same sitting)",
    )
    ap.add_argument("--json", default="", help="write the rows here as JSON")
    ap.add_argument("--reference", default="", help="the reference harness's results.json")
    args = ap.parse_args()
    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    if args.secure and "secure" not in wanted:
        wanted.append("secure")
    unknown = [p for p in wanted if p not in PHASES]
    if unknown:
        ap.error(f"unknown phase(s) {unknown}; choose from {list(PHASES)}")
    for p in wanted:
        PHASES[p]()
    print()
    print(table())
    reference: list[dict[str, Any]] = []
    if args.reference:
        with open(args.reference) as f:
            reference = json.load(f)["rows"]
    print()
    print(summary(reference))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "meta": {"label": "mpl", "date": time.strftime("%Y-%m-%d %H:%M:%S")},
                    "rows": ROWS,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
