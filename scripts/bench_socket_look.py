"""Instructions per look at an idle socket ("does a message wait?"), by callgrind.

Each way of looking runs ``--looks`` times in a process of its own under callgrind, and once
with no looks; the difference over the number of looks is its cost. Callgrind counts
user-space instructions only, not a system call's time in the kernel, so the system calls
per look (all threads) are shown beside it, from ``strace -c`` when it is installed. Used to
choose how ``mpl.wire.sockets.drain`` looks (``look_first``, and between receives).

    python scripts/bench_socket_look.py [--looks 20000]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import zmq

WAYS = ("none", "get_events", "getsockopt_events", "zmq_poll", "socket_poll")


def look(way: str, looks: int) -> None:
    """The child: ``looks`` looks at an idle, connected DEALER."""
    ctx: zmq.Context[Any] = zmq.Context()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    a.linger = b.linger = 0
    b.connect(f"tcp://127.0.0.1:{a.bind_to_random_port('tcp://127.0.0.1')}")
    get = zmq.backend.Socket.get
    events, pollin = int(zmq.EVENTS), int(zmq.POLLIN)
    watched: Any = [(a, pollin)]
    seen = 0
    for _ in range(looks):
        if way == "get_events":
            seen += bool(int(get(a, events)) & pollin)  # as drain read it
        elif way == "getsockopt_events":
            seen += bool(int(a.getsockopt(zmq.EVENTS)) & pollin)
        elif way == "zmq_poll":
            seen += bool(zmq.zmq_poll(watched, 0))
        elif way == "socket_poll":
            seen += bool(a.poll(0, pollin))
    assert seen == 0
    a.close()
    b.close()
    ctx.term()


def _child(way: str, looks: int) -> list[str]:
    return [sys.executable, __file__, "--child", way, "--looks", str(looks)]


def instructions(way: str, looks: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *_child(way, looks)],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", run.stderr)
    assert found is not None, run.stderr
    return int(found.group(1))


def syscalls(way: str, looks: int) -> int | None:
    if shutil.which("strace") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "strace.out"
        subprocess.run(
            ["strace", "-f", "-c", "-o", str(out), *_child(way, looks)],
            capture_output=True,
            check=True,
        )
        total = [line for line in out.read_text().splitlines() if line.rstrip().endswith("total")]
    return int(total[0].split()[3]) if total else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--looks", type=int, default=20_000)
    parser.add_argument("--child", choices=WAYS)
    args = parser.parse_args()
    if args.child:
        look(args.child, args.looks)
        return
    base = instructions("none", args.looks)
    base_calls = syscalls("none", args.looks)
    print(f"per look, {args.looks} looks at an idle DEALER (the loop itself subtracted)")
    for way in WAYS[1:]:
        cost = (instructions(way, args.looks) - base) / args.looks
        calls = syscalls(way, args.looks)
        extra = (
            f"  system calls {(calls - base_calls) / args.looks:.2f}"
            if calls is not None and base_calls is not None
            else ""
        )
        print(f"{way:18} {cost / 1000:6.2f}k instructions{extra}")


if __name__ == "__main__":
    main()
