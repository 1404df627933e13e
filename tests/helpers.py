"""Functions tests run on workers, and small test utilities (shipped by value)."""

from __future__ import annotations

import contextlib
import gc
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import zmq

from mpl.wire import GraphBuilder
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import decode
from mpl.wire.control import Welcome, WorkerHello
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Exec, Lit, Program
from mpl.wire.record import Record
from mpl.wire.seal import Sealer
from mpl.wire.sealed import Sealed
from mpl.wire.sessions import OpenSession, SessionOpened

R = TypeVar("R", bound=Record)


def sealer_pair(driver: str = "driver:a", node: str = "node:n0") -> tuple[Sealer, Sealer]:
    """A driver's and a node's ``Sealer``, each knowing the other's fresh CURVE key."""
    d, n = zmq.curve_keypair(), zmq.curve_keypair()
    return (
        Sealer(d[1].decode(), driver, {node: n[0].decode()}),
        Sealer(n[1].decode(), node, {driver: d[0].decode()}),
    )


def two_rank_keys(root: Path, base: ClusterSpec) -> tuple[ClusterSpec, dict[str, Path]]:
    """``base`` (two ranks) with fresh keys, made in ``root/keys``, for the broker, node0,
    node1 and the driver ``analyst``; and each one's secret key file, by that name."""
    from mpl.wire.keys import write_keypair

    names = ("broker", "node0", "node1", "analyst")
    made = {name: write_keypair(root / "keys", name) for name in names}
    spec = base.with_keys(
        made["broker"][2], [made["node0"][2], made["node1"][2]], {"analyst": made["analyst"][2]}
    )
    return spec, {name: made[name][1] for name in names}


def call_counter(calls: Counter[str], c_calls: bool = True) -> Callable[[Any, str, Any], None]:
    """A ``sys.setprofile`` function that counts into ``calls`` each Python function called
    (by name) and, with ``c_calls``, each C function (as ``C qualname``)."""

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[frame.f_code.co_name] += 1
        elif c_calls and event == "c_call":
            calls[f"C {arg.__qualname__}"] += 1

    return count


def run_profiled(
    profile: Callable[[Any, str, Any], None], fn: Callable[[], Any], n: int
) -> list[Any]:
    """``fn()`` ``n`` times with ``profile`` as ``sys.setprofile``'s function: the results."""
    results = []
    gc.collect()  # no collector run while counting: an old object's finalizer is not fn's
    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        for _ in range(n):
            results.append(fn())
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return results


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def blocked_in_wait(thread: threading.Thread, deadline_s: float = 10.0) -> None:
    """Poll until ``thread`` waits (a ``wait`` of threading's, such as a Condition's), so a
    test can wake it; returns at the deadline or when the thread ends, for the test's own
    assertions to judge."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and thread.is_alive():
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is not None and frame.f_code.co_name == "wait":
            return
        time.sleep(0.001)


def sample_execs() -> list[Exec]:
    """Exec records of every shape the lean Exec readers meet, for their tests against
    ``decode``: with and without a timeout, many ranks, store bindings, a ``Lit`` binding
    (a record: ``decode``'s to read)."""
    return [
        Exec("s1", "job-1", "d" * 32, (0, 1), {}, (0,)),
        Exec("s1", "job-2", "d" * 32, (0,), {}, (), 2.5),
        Exec("sess", "j", "dig", tuple(range(32)), {}, (0, 1, 2), 7),
        Exec("sess", "j", "dig", (1, 2), {1: ["sym:x", None], 2: [None]}, (0,)),
        Exec("sess", "j", "dig", (0, 1), {0: [Lit(1)]}, (0,)),
    ]


def decoded_exec(frames: list[bytes]) -> Exec | None:
    """What ``decode`` makes of ``frames`` if it is an ``Exec``; None if it refuses them or
    reads another record: what the lean Exec readers must agree with."""
    try:
        msg = decode(frames, unpickle=False)
    except ProtocolError:
        return None
    return msg if type(msg) is Exec else None


def decoded_as(
    cls: type[R], frames: Sequence[Any], *, unpickle: bool = True, safe: bool = False
) -> R:
    """``decode(frames, ...)``, which must be a ``cls``: its fields are then typed."""
    msg = decode(frames, unpickle=unpickle, safe=safe)
    assert isinstance(msg, cls), msg
    return msg


def compact_box(sealed: Sealed | bytes) -> bytes:
    """``Sealer.seal``'s answer for a small value, which must be a compact box."""
    assert type(sealed) is bytes, type(sealed)
    return sealed


def sealed_record(sealed: Sealed | bytes) -> Sealed:
    """``Sealer.seal``'s answer for a value with buffers, which must be a ``Sealed``."""
    assert type(sealed) is Sealed, type(sealed)
    return sealed


def mutated(header: bytes, rng: random.Random) -> bytes:
    """``header`` with one random byte changed, one bit flipped, its tail cut off, or one
    byte inserted: what the lean readers' mutation tests feed them next to ``decode``."""
    h = bytearray(header)
    kind = rng.randrange(4)
    at = rng.randrange(len(h))
    if kind == 0:
        h[at] = rng.randrange(256)
    elif kind == 1:
        h[at] ^= 1 << rng.randrange(8)
    elif kind == 2:
        del h[at:]
    else:
        h[at:at] = bytes([rng.randrange(256)])
    return bytes(h)


@contextlib.contextmanager
def raw_broker(world: int, make: Callable[[Any, str], Any]) -> Iterator[tuple[Any, Any]]:
    """A broker for ``world`` ranks on a free loopback port, and a maker of raw sockets on
    it: ``make(context, address)`` builds one (with its ZeroMQ socket as ``.sock``); every
    one is closed, and the broker stopped, at the end."""
    import zmq

    from mpl.broker.daemon import Broker
    from mpl.wire import ClusterSpec

    broker = Broker(ClusterSpec.simple(world), "tcp://127.0.0.1:0").start()
    ctx: zmq.Context[Any] = zmq.Context()
    made: list[Any] = []

    def raw() -> Any:
        made.append(make(ctx, broker.address))
        return made[-1]

    try:
        yield broker, raw
    finally:
        for r in made:
            r.sock.close(linger=0)
        ctx.term()
        broker.stop()
        broker.join(5)


@contextlib.contextmanager
def fake_broker(answer: Callable[[zmq.Socket[Any], bytes, list[bytes]], None]) -> Iterator[str]:
    """A ROUTER on a free loopback port standing in for a broker: on a thread of its own,
    ``answer(router, peer, frames)`` gets every message it receives (a driver's heartbeats
    too); yields its address. Thread, socket and context end with the block."""
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if router.poll(50):
                peer, *frames = router.recv_multipart()
                answer(router, peer, frames)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(5)
        router.close(linger=0)
        ctx.term()


@contextlib.contextmanager
def pushed_intake(
    ctx: zmq.Context[Any],
    mailbox: Any,
    on_event: Callable[[Any], None] = lambda event: None,
    *,
    code: str = "any",
    peers: int = 1,
) -> Iterator[tuple[Any, list[zmq.Socket[Any]]]]:
    """Rank 0's peer intake in plaintext (``mpl.worker.peer_intake``), taking moves into
    ``mailbox`` and telling ``on_event`` what it refuses, started on a free loopback port;
    and ``peers`` PUSH sockets connected to it, as other ranks' moves come. Yields both;
    all are closed at the end."""
    from mpl.wire.sockets import MAX_MESSAGE, configure
    from mpl.worker.peer_intake import PeerIntake

    intake = PeerIntake(
        ctx, "tcp://127.0.0.1:0", 0, mailbox, on_event,
        curve=None, trusted=False, code=code, max_message=MAX_MESSAGE,
    )  # fmt: skip
    pushes = [configure(ctx.socket(zmq.PUSH), linger_ms=1000) for _ in range(peers)]
    try:
        intake.start()
        for push in pushes:
            push.connect(intake.address)
        yield intake, pushes
    finally:
        for push in pushes:
            push.close()
        intake.stop(5)
        intake.close()


def joined_workers(raw: Callable[[], Any], world: int) -> list[Any]:
    """``world`` raw sockets made by ``raw``, each said hello as rank 0, 1, ... and
    welcomed by the broker."""
    workers = [raw() for _ in range(world)]
    for rank, w in enumerate(workers):
        w.send(
            WorkerHello(rank, f"inc{rank}", 100 + rank, "host", f"tcp://127.0.0.1:{rank + 9}", "")
        )
        w.wait_for(Welcome)
    return workers


def session_with_program(
    raw: Callable[[], Any], name: str, world: int, ranks: tuple[int, ...]
) -> tuple[Any, str, str]:
    """A driver's raw socket with session ``name`` open and a program sent: one constant
    (1) on ``ranks`` of a ``world``-rank graph. Returns the socket, the session, the
    digest."""
    driver = raw()
    driver.send(OpenSession(1, "", 60.0, name))
    opened, _ = driver.wait_for(SessionOpened)
    assert isinstance(opened, SessionOpened)
    b = GraphBuilder(world)
    graph = b.build(b.op("constant", [], ranks=ranks, value=1))
    driver.send(Program(graph.digest, graph))
    return driver, opened.session, graph.digest


def double(x: Any) -> Any:
    return x * 2


def add(a: Any, b: Any) -> Any:
    return a + b


def one() -> int:
    return 1


def boom(x: Any) -> Any:
    raise ValueError(f"boom on {x!r}")


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def nap_then(x: Any, seconds: float) -> Any:
    time.sleep(seconds)
    return x


def make_array(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


def chain(world: int = 2) -> GraphBuilder:
    return GraphBuilder(world)


def stats(client: Any, rank: int) -> dict[str, Any]:
    """The status row of ``rank`` (its heartbeat counters lag by up to one heartbeat)."""
    for row in client.status()["ranks"]:
        if row["rank"] == rank:
            return dict(row)
    raise KeyError(rank)


class Point:
    """A user class: not in the safe value format, so it only crosses a trusted cluster."""

    def __init__(self, x: int) -> None:
        self.x = x


def make_point(x: int) -> Point:
    return Point(x)


def point_x(p: Point) -> int:
    return p.x


def thread_name() -> str:
    """The name of the worker thread that runs this (the I/O thread or a session runner)."""
    import threading

    return threading.current_thread().name


def nap_then_thread(seconds: float) -> str:
    time.sleep(seconds)
    return thread_name()


def run_side_by_side(*fns: Callable[[], None], timeout: float = 120.0) -> list[BaseException]:
    """Run ``fns`` at once, each on its own thread; what they raised (and a ``TimeoutError``
    for any still running after ``timeout`` s), for the main thread to assert on."""
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported to the caller
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guarded(fn), daemon=True) for fn in fns]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    errors += [
        TimeoutError(f"{t.name} still running after {timeout} s") for t in threads if t.is_alive()
    ]
    return errors


def stable_objects(ctx: Any, rank: int) -> int:
    """The object count once two heartbeats in a row report the same number (one
    heartbeat read twice is one report: it may predate what the caller just did)."""
    last: list[tuple[int, float]] = []  # (objects, when its heartbeat came, about)

    def settled() -> bool:
        row = stats(ctx.client, rank)
        if row.get("objects") is None or row["heartbeat_age_s"] > 0.3:
            return False
        beat = time.monotonic() - row["heartbeat_age_s"]
        if last and beat - last[-1][1] < 0.1:  # the same heartbeat (they are 1 s apart)
            return False
        last.append((row["objects"], beat))
        return len(last) >= 2 and last[-1][0] == last[-2][0]

    wait_until(settled, timeout=10, what="a stable object count")
    return last[-1][0]
