"""Shared by the examples: connect to a running cluster (--url) or start a local one."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator

import mpl.driver as mp


@contextlib.contextmanager
def cluster(description: str, world_size: int) -> Iterator[mp.Context]:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--url",
        help="a running broker (e.g. from scripts/cluster-up.sh); "
        "default: start a local cluster for this run",
    )
    parser.add_argument("--sim", action="store_true", help="run in-process (mp.Simulator)")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="without --url: a local cluster in secure mode (fresh keys, CurveZMQ everywhere)",
    )
    parser.add_argument("--key", help="with --url: this driver's secret key file (secure mode)")
    parser.add_argument("--cluster", help="with --key: your copy of the spec pinning the keys")
    args = parser.parse_args()
    if args.url:
        ctx = mp.connect(args.url, key=args.key, cluster=args.cluster)
        if ctx.cluster.world_size < world_size:  # say so before a device is missing
            ctx.close()
            parser.exit(
                2,
                f"{parser.prog}: this example needs {world_size} parties; the cluster at "
                f"{args.url} has {ctx.cluster.world_size} (start one with "
                f"scripts/cluster-up.sh {world_size})\n",
            )
        with ctx:
            try:
                yield ctx
                trace = os.environ.get("MPL_TRACE")  # scripts/demo.sh: trace the last job
                if trace and ctx.jobs:
                    ctx.trace(trace, last=1)
            finally:
                ctx.close()
    elif args.sim:
        sim = mp.Simulator.simple(world_size)
        with sim:
            try:
                yield sim
            finally:
                sim.close()
    else:
        with mp.local_cluster(world_size, secure=args.secure) as ctx:
            yield ctx
