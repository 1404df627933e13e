"""Where a trivial job's CPU goes: instructions per job in every process, by callgrind.

Starts a local cluster (``--world`` workers, no SPU) whose broker and workers run under
``valgrind --tool=callgrind`` with instrumentation off, as is this script's own driver
process; warms up, turns instrumentation on in every process for ``--jobs`` trivial jobs
(an ``@mp.function`` pcall on every rank returning 1, then a fetch), off again, and stops
the cluster. The workers run with their inline threshold pinned high (``mpl-worker
--inline-ms``): a trivial job slowed down by valgrind would miss the default 1 ms and
spill to the job threads, so their figures are those of the inline path a repeat quick job
takes outside valgrind (it warns if the workers' stats say otherwise). Once per mode
(``--modes plain,secure``: secure is CurveZMQ plus end-to-end sealing). Instruction counts
repeat to within a few thousand per job on a busy machine, where wall-clock timings do
not; the timer ticks a process takes while it waits still count, so compare runs of one
sitting.

Prints instructions per job per process for each mode and, with two modes, the
difference; ``--top K`` adds the K functions whose cost per job changed most between the
modes, per process (``callgrind_annotate``'s exclusive counts). Needs valgrind
(``apt-get install valgrind``); each mode takes about a minute.

  .venv/bin/python scripts/profile_jobs.py --jobs 300 --top 15 --json profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

_WARMUP_JOBS = 30
# and at least this long: each kind of message a process reads is prepared on its first
# read (a record's field types, compiled once), and some come only with the heartbeats
# (1 s apart in the cluster it starts); counted, the first ones cost ~1k a job of 300
_WARMUP_S = 2.5
# the workers' inline threshold under valgrind (ms): far above a slowed trivial job's run
_INLINE_MS = "1000"
_TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)
# an annotate row: "1,234,567 (12.34%)  file:function [object]"
_ROW = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*?)(?: \[(.*)\])?$")
_LEVEL = re.compile(r"'\d+$")


def _callgrind(out: Path, name: str) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--separate-threads=yes",  # a file per thread: <name>.<pid>-<thread>
        f"--callgrind-out-file={out}/{name}.%p",
    ]


def _instrument(pids: list[int], state: str) -> None:
    for pid in pids:
        done = subprocess.run(
            ["callgrind_control", "-i", state, str(pid)], capture_output=True, timeout=60
        )
        if done.returncode != 0:
            raise SystemExit(f"callgrind_control -i {state} {pid} failed: {done.stderr!r}")


def run_jobs(mode: str, world: int, jobs: int, out: Path) -> None:
    """In the driver process under callgrind: the cluster, the jobs, and a roles file
    naming each pid's process."""
    import mpl.driver as mp

    spec = mp.ClusterSpec.simple(world, enable_spu=False)
    cluster = mp.local_cluster(
        spec,
        timeout=300.0,
        ready_timeout=300.0,  # processes under valgrind on a busy machine start slowly
        secure=mode == "secure",
        run_under=_callgrind(out, "daemon"),
        worker_args=("--inline-ms", _INLINE_MS),
    )
    try:
        mp.set_context(cluster)
        ranks = tuple(range(world))
        job = mp.function(lambda: mp.simp.pcall(ranks, lambda: 1))
        warm_until = time.monotonic() + _WARMUP_S
        warmed = 0
        while warmed < _WARMUP_JOBS or time.monotonic() < warm_until:
            mp.fetch(job())
            warmed += 1
        procs = cluster.processes
        assert procs.broker is not None
        roles = {os.getpid(): "driver", procs.broker.pid: "broker"}
        roles.update({p.pid: f"worker{r}" for r, p in procs.workers.items()})
        # the driver (first in roles) on last and off first: each callgrind_control is a
        # process this one starts, which would count as its work
        _instrument(list(roles)[::-1], "on")
        started = time.monotonic()
        for _ in range(jobs):
            mp.fetch(job())
        wall = time.monotonic() - started
        _instrument(list(roles), "off")
        pooled = _pooled(cluster, world, warmed + jobs)
        (out / "pooled.json").write_text(json.dumps(pooled))
        (out / "wall.json").write_text(json.dumps(wall))
        (out / "roles.json").write_text(json.dumps({str(k): v for k, v in roles.items()}))
        mp.set_context(None)
    finally:
        cluster.close()


def _pooled(cluster: Any, world: int, total: int) -> list[int]:
    """Each worker's jobs that ran on its pool rather than inline (its first run of a
    program always does), from its stats once its heartbeat reports all ``total`` done."""
    deadline = time.monotonic() + 300
    while True:
        ranks = cluster.status()["ranks"]
        if all(int(r["jobs_done"]) >= total for r in ranks) or time.monotonic() > deadline:
            return [int(r["jobs_done"]) - int(r["jobs_inline"]) for r in ranks[:world]]
        time.sleep(0.5)


def _profile(mode: str, world: int, jobs: int, out: Path) -> dict[str, dict[int, Path]]:
    """Run one mode in a driver under callgrind; each role's callgrind file per thread
    (1: the main thread, which is a daemon's I/O thread)."""
    out.mkdir(parents=True)
    cmd = [
        *_callgrind(out, "driver"),
        sys.executable,
        __file__,
        "--child",
        mode,
        "--world",
        str(world),
        "--jobs",
        str(jobs),
        "--out",
        str(out),
    ]
    print(f"{mode}: {jobs} jobs on {world} workers under callgrind ...", file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, timeout=3600)
    roles_file = out / "roles.json"
    if done.returncode != 0 or not roles_file.exists():
        raise SystemExit(f"{mode} run failed ({done.returncode}): {done.stderr[-2000:]!r}")
    roles = json.loads(roles_file.read_text())
    pooled = json.loads((out / "pooled.json").read_text())
    if any(n > 1 for n in pooled):  # the workers' figures would be partly the pool's
        print(f"{mode}: jobs run on the pool, per rank: {pooled} (1 expected)", file=sys.stderr)
    wall = json.loads((out / "wall.json").read_text())
    print(f"{mode}: {wall / jobs * 1e3:.1f} ms a job under callgrind", file=sys.stderr)
    files: dict[str, dict[int, Path]] = {}
    for path in out.iterdir():
        pid, _, thread = path.name.rsplit(".", 1)[-1].partition("-")
        if pid in roles and thread.isdigit():
            files.setdefault(roles[pid], {})[int(thread)] = path
    return files


def instructions(path: Path) -> int:
    """All instructions a callgrind file counted (every thread's part)."""
    return sum(int(n) for n in _TOTALS.findall(path.read_bytes()))


# libzmq calls counted per job on a daemon's main thread: its loop's turns (a receive per
# turn, a message or a timeout), the receive timeout's resets, the idle waits (polls)
_ZMQ_CALLS = ("zmq_msg_recv", "zmq_setsockopt", "zmq_poll")
_NAMED = re.compile(rb"^c?fn=\((\d+)\) (\S+)", re.M)
_CALLED = re.compile(rb"^cfn=\((\d+)\).*\ncalls=(\d+)", re.M)


def zmq_calls(path: Path) -> Counter[str]:
    """How often a callgrind file's thread called each of ``_ZMQ_CALLS`` (callgrind names a
    function in full once, then by its number)."""
    text = path.read_bytes()
    names = {number: name.decode(errors="replace") for number, name in _NAMED.findall(text)}
    counts: Counter[str] = Counter()
    for number, calls in _CALLED.findall(text):
        called = names.get(number, "")
        if called in _ZMQ_CALLS:
            counts[called] += int(calls)
    return counts


def functions(path: Path) -> Counter[str]:
    """Exclusive instructions per function (``function [object]``) in a callgrind file."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    costs: Counter[str] = Counter()
    for line in text.splitlines():
        row = _ROW.match(line)
        if row is None or "PROGRAM TOTALS" in line:
            continue
        # a function's recursion levels ('2) as one; inlined code is listed without its object
        name = _LEVEL.sub("", row.group(2).rsplit(":", 1)[-1])
        obj = Path(row.group(3)).name if row.group(3) else "inlined"
        costs[f"{name} [{obj}]"] += int(row.group(1).replace(",", ""))
    return costs


def _all_functions(threads: dict[int, Path]) -> Counter[str]:
    """:func:`functions` over every thread of a process."""
    costs: Counter[str] = Counter()
    for path in threads.values():
        costs.update(functions(path))
    return costs


def by_object(costs: Counter[str]) -> Counter[str]:
    """``functions``' counts summed per object (libsodium: CurveZMQ; libpython: Python)."""
    out: Counter[str] = Counter()
    for name, n in costs.items():
        out[name.rsplit(" [", 1)[-1][:-1]] += n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300, help="jobs counted per mode (300)")
    ap.add_argument("--world", type=int, default=2, help="workers, every one in the pcall (2)")
    ap.add_argument("--modes", default="plain,secure", help="plain, secure or both (both)")
    ap.add_argument("--top", type=int, default=0, help="functions that changed most, per process")
    ap.add_argument("--json", default="", help="write the figures here as JSON")
    ap.add_argument("--keep", default="", help="keep the callgrind files in this directory")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_jobs(args.child, args.world, args.jobs, Path(args.out))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if not modes or not set(modes) <= {"plain", "secure"} or args.jobs < 1 or args.world < 1:
        ap.error("--modes takes plain and/or secure; --jobs and --world at least 1")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        ap.error("needs valgrind and callgrind_control on PATH (apt-get install valgrind)")
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mpl-profile-"))
    try:
        files = {m: _profile(m, args.world, args.jobs, root / m) for m in modes}
        # every thread's, and the main thread's alone (a daemon's I/O thread, the driver's
        # caller: the Python of the job; the others are ZeroMQ's I/O threads and helpers)
        per_job = {
            m: {r: sum(map(instructions, t.values())) / args.jobs for r, t in f.items()}
            for m, f in files.items()
        }
        main_thread = {
            m: {r: instructions(t[1]) / args.jobs for r, t in f.items() if 1 in t}
            for m, f in files.items()
        }
        report: dict[str, Any] = {
            "jobs": args.jobs,
            "world": args.world,
            "per_job": per_job,
            "main_thread": main_thread,
        }
        roles = sorted(per_job[modes[0]], key=lambda r: (r != "driver", r != "broker", r))
        print(f"\ninstructions per trivial job ({args.jobs} jobs, world {args.world})")
        print(
            f"{'process':10s}"
            + "".join(f"{m:>12s}{'(main)':>10s}" for m in modes)
            + ("  difference" if len(modes) == 2 else "")
        )
        for role in roles:
            row = [per_job[m].get(role, 0.0) for m in modes]
            main = [main_thread[m].get(role, 0.0) for m in modes]
            diff = f"  {row[1] - row[0]:+10.0f}" if len(row) == 2 else ""
            cells = "".join(f"{v:12.0f}{w:10.0f}" for v, w in zip(row, main, strict=True))
            print(f"{role:10s}{cells}{diff}")
        # turns with no job (timeouts, the broker's heartbeats) and heartbeats of its own
        # take a worker's I/O thread as often as the clock says: under valgrind, where a
        # job takes ten times as long, ten times as many of them fall to each job
        print("\nlibzmq calls per job on the main thread (receives: turns of the loop)")
        for m in modes:
            for role in roles:
                # (a role may have no file in a mode: a process that ended before it wrote)
                if role.startswith("worker") and 1 in files[m].get(role, {}):
                    calls = zmq_calls(files[m][role][1])
                    per = "".join(f"  {c[4:]} {calls[c] / args.jobs:.2f}" for c in _ZMQ_CALLS)
                    report.setdefault("zmq_calls", {}).setdefault(m, {})[role] = dict(calls)
                    print(f"{m:7s}{role:10s}{per}")
        if args.top and len(modes) == 2:
            report["changed"] = {}
            for role in roles:
                a, b = (_all_functions(files[m].get(role, {})) for m in modes)
                delta = {k: (b[k] - a[k]) / args.jobs for k in a.keys() | b.keys()}
                top = sorted(delta.items(), key=lambda kv: -abs(kv[1]))[: args.top]
                a_obj, b_obj = by_object(a), by_object(b)
                objects = {
                    k: (b_obj[k] - a_obj[k]) / args.jobs for k in a_obj.keys() | b_obj.keys()
                }
                report["changed"][role] = {"functions": dict(top), "objects": objects}
                title = f"the {args.top} functions that changed most, per job"
                print(f"\n{role}: {title} ({modes[1]} - {modes[0]})")
                for name, value in top:
                    print(f"  {value:+10.0f}  {name[:100]}")
                print("  by object:")
                for name, value in sorted(objects.items(), key=lambda kv: -abs(kv[1]))[: args.top]:
                    print(f"  {value:+10.0f}  {name}")
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
