"""Benchmark phases for jobs in flight, fan-out, the eager path and CPU per job, each
against a raw pyzmq relay of the same shape measured in the same run (see scripts/bench.py).
"""

from __future__ import annotations

import collections
import itertools
import os
import statistics
import subprocess
import time
from typing import Any

from bench_common import free_ports, measure, percentiles, record, spawn, start_cluster

# A raw request: one frame, as each of mpl's messages is (wire v4: magic and header in one
# frame), and about the size of a trivial job's header.
_REQUEST = b"r" + b"x" * 40


class _RawRelay:
    """Raw pyzmq relay processes (one echo, or N echoes behind a fan-out relay)."""

    def __init__(self, echoes: int = 1, fan: bool = False, curve: bool = False) -> None:
        import zmq

        front, back = (f"tcp://127.0.0.1:{p}" for p in free_ports(2))
        relay = ("fanrelay", front, back, str(echoes)) if fan else ("relay", front, back)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        server: dict[str, str] = {}
        client: dict[str, str] = {}
        if curve:  # CURVE on every socket, fresh throw-away keys: the secure floor
            public, secret = (k.decode() for k in zmq.curve_keypair())
            server, client = {"MPL_BENCH_CURVE_SECRET": secret}, {"MPL_BENCH_CURVE_SERVER": public}
            self.sock.curve_serverkey = public.encode()
            self.sock.curve_publickey, self.sock.curve_secretkey = zmq.curve_keypair()
        self.procs = [spawn(*relay, env=server)]
        self.procs += [spawn("echo", back, env=client) for _ in range(echoes)]
        self.sock.connect(front)
        deadline = time.monotonic() + 30
        for i in itertools.count():  # the echoes are registered once a request comes back
            self.sock.send(b"ping%d" % i)
            if self.sock.poll(200):
                self.sock.recv_multipart()
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the raw relay did not come up")
        while self.sock.poll(50):  # answers to the pings sent while it was coming up
            self.sock.recv_multipart()

    def round_trip(self) -> None:
        self.sock.send(_REQUEST)
        self.sock.recv_multipart()

    def windowed(self, total: int, window: int) -> float:
        """Round trips per second with ``window`` requests kept in flight."""
        t0 = time.perf_counter()
        sent = done = 0
        while sent < min(window, total):
            self.sock.send(_REQUEST)
            sent += 1
        while done < total:
            self.sock.recv_multipart()
            done += 1
            if sent < total:
                self.sock.send(_REQUEST)
                sent += 1
        return total / (time.perf_counter() - t0)

    def close(self) -> None:
        self.sock.send(b"stop")
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
    """Trivial jobs per second with a window of jobs in flight, against the raw relay.

    The raw relay and the cluster are up at once and take turns, round by round: the
    machine's speed drifts within a sitting, and a floor measured before the cluster
    started made the ratio mostly a measure of that drift. Each round's ratio is recorded
    too. CPU per job and busy share count the cluster's rounds only.
    """
    import mpl.driver as mp

    total = {1: 1000, 8: 2000, 64: 3000}
    rounds = 5
    raw = _RawRelay()
    try:
        with start_cluster(2) as ctx:
            job = mp.function(lambda: mp.device("P0")(lambda: 1)())
            mp.fetch(job())
            pids = _cluster_pids(ctx)

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
                rates: list[float] = []
                floors: list[float] = []
                used = dict.fromkeys(["driver", *pids], 0.0)
                wall = 0.0
                for _ in range(rounds):
                    floors.append(raw.windowed(n, window))
                    before = {k: _cpu_s(p) for k, p in pids.items()}
                    t0, w0 = time.process_time(), time.perf_counter()
                    rates.append(windowed(n, window))
                    wall += time.perf_counter() - w0
                    used["driver"] += time.process_time() - t0
                    for k, p in pids.items():
                        used[k] += _cpu_s(p) - before[k]
                # which process limits the pipeline: its CPU per job, and how busy it was
                record(
                    "pipeline",
                    f"CPU per job with {window} in flight: "
                    + ", ".join(f"{k} {v / (rounds * n) * 1e6:.0f} µs" for k, v in used.items()),
                    [sum(used.values()) / (rounds * n)],
                )
                record(
                    "pipeline",
                    f"busy share of one core with {window} in flight: "
                    + ", ".join(f"{k} {v / wall:.0%}" for k, v in used.items()),
                    [sum(used.values()) / wall],
                    unit="cores",
                )
                record(
                    "pipeline",
                    f"trivial jobs/s, {window} in flight (mp.submit), 2p",
                    rates,
                    unit="jobs/s",
                    floor=statistics.median(floors),
                )
                record(
                    "pipeline",
                    f"mpl / raw relay jobs/s per round (taking turns), {window} in flight",
                    [r / f for r, f in zip(rates, floors, strict=True)],
                    unit="x",
                )
    finally:
        raw.close()


def phase_fanout() -> None:
    """One job to all n ranks and n replies gathered, against a raw relay doing the same.

    The raw relay and the cluster are up at once and take turns (nine turns per size: the
    median of a few turns' ratios moved by 0.3-0.5 between runs on 2 cores), so the
    machine's drift within a sitting falls on both alike; each turn's ratio is recorded.
    """
    import mpl.driver as mp

    medians: dict[int, float] = {}
    turns = 9
    for world in (2, 4, 8, 16, 32):
        reps = 100 if world <= 8 else 40
        raw = _RawRelay(world, fan=True)
        try:
            with start_cluster(world):
                job = _trivial_all(world)
                measure(raw.round_trip, 50, warmup=0)
                measure(lambda job=job: mp.fetch(job()), 20, warmup=0)
                xs: list[float] = []
                floor: list[float] = []
                ratios: list[float] = []
                for _ in range(turns):
                    raw_turn = measure(raw.round_trip, reps, warmup=5)
                    mine = measure(lambda job=job: mp.fetch(job()), reps, warmup=5)
                    ratios.append(statistics.median(mine) / statistics.median(raw_turn))
                    floor += raw_turn
                    xs += mine
        finally:
            raw.close()
        medians[world] = statistics.median(xs)
        record(
            "fanout",
            f"trivial pcall on all {world} ranks + fetch",
            xs,
            floor=statistics.median(floor),
            **percentiles(xs),
        )
        record(
            "fanout",
            f"mpl / raw fan-out p50 per turn (taking turns), {world} ranks",
            ratios,
            unit="x",
        )
    per_rank = [(medians[b] - medians[a]) / (b - a) for a, b in itertools.pairwise(sorted(medians))]
    record("fanout", "cost per added rank (between successive sizes)", per_rank)


def phase_eager() -> None:
    """Eager move + call per call, and the driver's own cost of eager and compiled calls."""
    import mpl.driver as mp
    from mpl.driver.job_site import JobSite
    from mpl.wire.jobs import JobResult

    raw = _RawRelay()
    floor = statistics.median(measure(raw.round_trip, 2000, warmup=200))
    raw.close()
    with start_cluster(2) as ctx:
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
        # a synchronous job goes through its call site's compiled path (JobSite.run), the
        # rest through Client.submit: both answer at once, as an empty result
        real, real_run = ctx.client.submit, JobSite.run
        ctx.client.submit = lambda *a, **kw: JobResult("bench.1")  # type: ignore[method-assign]
        JobSite.run = lambda site, bindings: ("bench.1", {}, {})  # type: ignore[method-assign,assignment]
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
            JobSite.run = real_run  # type: ignore[method-assign]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cluster_pids(ctx: Any) -> dict[str, int]:
    procs = ctx.processes
    assert procs.broker is not None
    return {"broker": procs.broker.pid, **{f"worker{r}": p.pid for r, p in procs.workers.items()}}


def _cpu_per_call(pids: dict[str, int], call: Any, n: int) -> dict[str, float]:
    """CPU seconds per ``call()`` in this process ("driver") and in each of ``pids``."""
    before = {k: _cpu_s(p) for k, p in pids.items()}
    t0 = time.process_time()
    for _ in range(n):
        call()
    used = {"driver": time.process_time() - t0}
    used.update({k: _cpu_s(p) - before[k] for k, p in pids.items()})
    return {k: v / n for k, v in used.items()}


def phase_cpu() -> None:
    """CPU seconds per trivial job in each process, against the raw fan-out relay's processes
    (one request to both echoes, both replies gathered: the same messages as a 2p job).

    Both are up at once and take turns, five rounds of 1,000 jobs each; /proc's CPU times
    tick at 10 ms, so a round's reading is good to about 10 µs a job, and the median of
    the rounds is the figure."""
    import mpl.driver as mp

    n, rounds = 1000, 5
    raw = _RawRelay(2, fan=True)
    raw_pids = {"broker": raw.procs[0].pid, "worker": raw.procs[1].pid}
    floors: dict[str, list[float]] = collections.defaultdict(list)
    mine: dict[str, list[float]] = collections.defaultdict(list)
    try:
        with start_cluster(2) as ctx:
            job = _trivial_all(2)
            measure(lambda: mp.fetch(job()), 100, warmup=0)
            measure(raw.round_trip, 100, warmup=0)
            pids = _cluster_pids(ctx)
            for _ in range(rounds):
                for k, v in _cpu_per_call(raw_pids, raw.round_trip, n).items():
                    floors[k].append(v)
                for k, v in _cpu_per_call(pids, lambda: mp.fetch(job()), n).items():
                    mine[k].append(v)
    finally:
        raw.close()
    for name, xs in mine.items():
        role = "worker" if name.startswith("worker") else name
        record(
            "cpu",
            f"CPU per trivial job (pcall on both ranks), {name}",
            xs,
            floor=statistics.median(floors[role]),
        )
