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
  import     `import mpl.driver` in a fresh process (bytecode cached, and with none)
  startup    broker + 2 workers until ready (bytecode cached, and with none); idle worker RSS
  secure     (--secure) plaintext vs secure (CurveZMQ + end-to-end sealing) daemons in one
             sitting: trivial job + fetch, 64 MiB P0->P1 move, 64 MiB fetch to the driver,
             raw CURVE PUSH/PULL floor, secure connect-to-first-job, sealing alone, the
             secure/plaintext p50 ratio per turn and CPU per trivial job in each process
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

The phases up to ``secure`` are here; ``bench_speed.py`` holds pipeline, fanout, eager and
cpu, ``bench_soak.py`` the soak, ``bench_floor.py`` the raw floor processes,
``bench_common.py`` the rows and timing helpers and ``bench_report.py`` the tables.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench_common import (
    HERE,
    MIB,
    ROWS,
    free_ports,
    measure,
    percentiles,
    record,
    spawn,
    start_cluster,
)
from bench_report import summary, table
from bench_speed import phase_cpu, phase_eager, phase_fanout, phase_pipeline

# -- phases --------------------------------------------------------------------------------


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

    def rt() -> None:  # one frame each way, as every mpl message is (wire v4)
        d.send(b"r" + b"x" * 40)
        d.recv_multipart()

    xs = measure(rt, 2000, warmup=200)
    record("floor", "raw pyzmq driver->relay->worker round trip", xs, **percentiles(xs))
    d.send(b"stop")
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


def phase_dist() -> None:
    """Real daemons on loopback: trivial jobs, a 64 MiB move."""
    import numpy as np

    import mpl.driver as mp

    for world in (2, 3):
        with start_cluster(world):
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
        with start_cluster(world, protocol, field) as ctx:
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


def _bytecode_envs(tmp: str) -> dict[str, dict[str, str]]:
    """Environment overrides for the processes a start or import phase runs: with compiled
    modules cached (as an installed package has them; here in a directory of the run's own,
    not beside the sources), and with none (every module compiled from source, as under
    PYTHONDONTWRITEBYTECODE with no cache about: about twice the instructions)."""
    return {
        "": {"PYTHONPYCACHEPREFIX": os.path.join(tmp, "cached"), "PYTHONDONTWRITEBYTECODE": ""},
        ", no bytecode cache": {
            "PYTHONPYCACHEPREFIX": os.path.join(tmp, "empty"),
            "PYTHONDONTWRITEBYTECODE": "1",
        },
    }


def phase_import() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for label, env in _bytecode_envs(tmp).items():
            times = []
            for _ in range(6):  # the first (which fills the cache) is not counted
                t0 = time.perf_counter()
                cmd = [sys.executable, "-c", "import mpl.driver"]
                subprocess.run(cmd, check=True, env={**os.environ, **env})
                times.append(time.perf_counter() - t0)
            record("import", f"(c) fresh `python -c 'import mpl.driver'` wall{label}", times[1:])


def phase_startup() -> None:
    from mpl.driver.launcher import ProcessCluster
    from mpl.wire import ClusterSpec

    with tempfile.TemporaryDirectory() as tmp:
        for label, env in _bytecode_envs(tmp).items():
            ProcessCluster(ClusterSpec.simple(2), env=env).close()  # fills the cache
            times, rss = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                cluster = ProcessCluster(ClusterSpec.simple(2), env=env)
                times.append(time.perf_counter() - t0)
                if not label:
                    time.sleep(1.0)  # idle a moment before reading memory
                    rss += [_rss_mib(p.pid) for p in cluster.workers.values()]
                cluster.close()
            record("startup", f"(c) start broker + 2 workers -> all ready{label}", times)
            if rss:
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
        raw_rates = [_raw_move(ctx, 64, curve=curve) for _ in range(6)]
        record("secure", f"raw pyzmq {name}PUSH->PULL 64 MiB", raw_rates[1:], unit="MB/s")
    ctx.term()
    _raw_curve_latency()
    # Both clusters run at once and take turns, so load from elsewhere on a shared machine
    # falls on both alike.
    spec = mp.ClusterSpec.simple(2, enable_spu=False)
    clusters = {
        mode: mp.local_cluster(spec, timeout=60.0, secure=mode == "secure")
        for mode in ("plaintext", "secure")
    }
    try:
        _secure_latency(clusters)
        rates: dict[str, list[float]] = {mode: [] for mode in clusters}
        fetches: dict[str, list[float]] = {mode: [] for mode in clusters}
        for turn in range(6):
            for mode, cluster in clusters.items():
                mp.set_context(cluster)  # not `with`: leaving it would stop the cluster
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
        _secure_cpu(clusters)
        for mode in clusters:
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


def _raw_curve_latency() -> None:
    """The secure floor: a raw pyzmq relay's round trip (driver -> relay -> echo and back,
    the shape of a one-rank job) with CURVE on every socket, against the same relay in
    plaintext; both up at once, taking six turns of 500 round trips."""
    from bench_speed import _RawRelay

    relays = {"plaintext": _RawRelay(), "CURVE": _RawRelay(curve=True)}
    try:
        times: dict[str, list[float]] = {mode: [] for mode in relays}
        ratios = []
        for _ in range(6):
            p50 = {}
            for mode, relay in relays.items():
                xs = measure(relay.round_trip, 500, warmup=20)
                p50[mode] = statistics.median(xs)
                times[mode] += xs
            ratios.append(p50["CURVE"] / p50["plaintext"])
    finally:
        for relay in relays.values():
            relay.close()
    for mode, xs in times.items():
        record("secure", f"raw pyzmq relay round trip, {mode}", xs, **percentiles(xs))
    record(
        "secure", "raw pyzmq relay round trip: CURVE / plaintext p50, per turn", ratios, unit="x"
    )


def _secure_latency(clusters: dict[str, Any]) -> None:
    """Trivial-job latency, secure against plaintext: twelve turns of 100 jobs of each
    kind per mode, the modes' order alternating turn by turn so that neither always runs
    right after the other; each turn's secure/plaintext p50 ratio is recorded too."""
    import mpl.driver as mp

    kinds: dict[str, Callable[[], Any]] = {
        "trivial job (pcall on P0) + fetch, 2p": lambda: mp.device("P0")(lambda: 1),
        "trivial pcall on both ranks + fetch, compiled, 2p": lambda: mp.function(
            lambda: mp.simp.pcall((0, 1), lambda: 1)
        ),
    }
    times: dict[tuple[str, str], list[float]] = {(k, m): [] for k in kinds for m in clusters}
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    modes = list(clusters)
    for turn in range(12):
        p50: dict[tuple[str, str], float] = {}
        for mode in modes if turn % 2 == 0 else modes[::-1]:
            mp.set_context(clusters[mode])  # not `with`: leaving it would stop the cluster
            for kind, make in kinds.items():
                job = make()
                xs = measure(lambda job=job: mp.fetch(job()), 100, warmup=10)
                p50[kind, mode] = statistics.median(xs)
                times[kind, mode] += xs
        for kind in kinds:
            ratios[kind].append(p50[kind, "secure"] / p50[kind, "plaintext"])
    mp.set_context(None)
    for kind in kinds:
        for mode in modes:
            xs = times[kind, mode]
            record("secure", f"{kind}, {mode}", xs, **percentiles(xs))
        record("secure", f"{kind}: secure / plaintext p50, per turn", ratios[kind], unit="x")


def _secure_cpu(clusters: dict[str, Any]) -> None:
    """CPU per trivial job in each process, secure against plaintext (the modes take turns,
    so load from elsewhere falls on both alike); the plaintext figure is the row's floor."""
    from bench_speed import _cluster_pids, _cpu_s

    import mpl.driver as mp

    used: dict[str, collections.defaultdict[str, list[float]]]
    n, used = 2000, {mode: collections.defaultdict(list) for mode in clusters}
    for _ in range(3):
        for mode, cluster in clusters.items():
            mp.set_context(cluster)
            one = mp.device("P0")(lambda: 1)
            for _ in range(20):
                mp.fetch(one())
            pids = _cluster_pids(cluster)
            before = {k: _cpu_s(p) for k, p in pids.items()}
            t0 = time.process_time()
            for _ in range(n):
                mp.fetch(one())
            used[mode]["driver"].append((time.process_time() - t0) / n)
            for k, p in pids.items():
                used[mode][k].append((_cpu_s(p) - before[k]) / n)
    mp.set_context(None)
    for name, xs in used["secure"].items():
        if not any(xs):  # a rank the job does not use
            continue
        floor = statistics.median(used["plaintext"][name])
        record("secure", f"CPU per trivial job (pcall on P0), secure, {name}", xs, floor=floor)


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
