"""A real ``Broker`` whose loop a test turns by hand, and the peers that stand around it.

The broker's counting tests (``test_broker_counts``, ``test_secure_broker_counts``,
``test_broker_batch_counts`` and those that borrow their rigs) each start the same scene:
a broker, DEALER sockets for its workers and a driver, the workers' hellos, a session
opened and one program sent. :class:`HandTurnedBroker` is that scene, in plaintext or over
CurveZMQ (``curves``: each party's, by name); :func:`turned_until` and
:func:`turned_frames` turn the loop until a socket gets what it waits for, the turns
counted by a ``sys.setprofile`` function if one is given.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import zmq

from mpl.broker.daemon import Broker
from mpl.wire import GraphBuilder
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.control import WorkerHello
from mpl.wire.curve import Curve
from mpl.wire.jobs import Program
from mpl.wire.sessions import OpenSession, SessionOpened

__all__ = ["HandTurnedBroker", "turned_frames", "turned_until"]


def turned_frames(
    broker: Any,
    sock: zmq.Socket[Any],
    take: Callable[[list[bytes]], bool] = lambda frames: True,
    count: Any = None,
    turns: int = 1000,
) -> list[bytes]:
    """The frames of the next message to ``sock`` that ``take`` takes (those before it
    skipped), ``broker``'s loop turned by hand until it comes (counted by ``count``)."""
    for _ in range(turns):  # each turn ends after RCVTIMEO with nothing queued
        if sock.poll(0):
            frames: list[bytes] = sock.recv_multipart()
            if take(frames):
                return frames
            continue
        sys.setprofile(count)
        try:
            broker._turn(float("inf"))
        finally:
            sys.setprofile(None)
    raise AssertionError("the broker sent nothing of what was waited for")


def turned_until(
    broker: Any, sock: zmq.Socket[Any], kind: type[Any], count: Any = None, turns: int = 1000
) -> Any:
    """The next message of ``kind`` to ``sock``, decoded (others skipped), ``broker``'s
    loop turned by hand until it comes (its turns counted by ``count`` if given)."""
    got: list[Any] = []

    def take(frames: list[bytes]) -> bool:
        msg = decode(from_wire(frames), unpickle=False)
        got.append(msg)
        return isinstance(msg, kind)

    try:
        turned_frames(broker, sock, take, count, turns)
    except AssertionError:
        raise AssertionError(f"no {kind.__name__}") from None
    return got[-1]


class HandTurnedBroker:
    """A real ``Broker`` for ``spec`` at ``address``, its loop turned by hand (``_turn``
    with no timers due), and DEALER sockets for its workers (``workers``, rank order) and a
    driver (``driver``, routing id ``drv:<name>/0001``): the workers have said hello, the
    driver has opened a session (``sid``, named ``name``) and sent ``graph``, a constant on
    ``ranks`` (every rank if None). With ``curves`` each socket dials with its party's key
    (``node<rank>``, the driver ``analyst``) and the broker serves with ``broker``'s.
    ``rcvtimeo``: how long a turn waits once nothing is queued (ms)."""

    def __init__(
        self,
        spec: ClusterSpec,
        address: str,
        name: str,
        *,
        ranks: tuple[int, ...] | None = None,
        curves: dict[str, Curve] | None = None,
        rcvtimeo: int = 5,
        turns: int = 1000,
    ) -> None:
        self.spec, self.curves, self.turns = spec, curves or {}, turns
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.broker = Broker(spec, address, context=self.ctx, curve=self.curves.get("broker"))
        self.broker.router.setsockopt(zmq.RCVTIMEO, rcvtimeo)
        self.socks: list[zmq.Socket[Any]] = []
        world = spec.world_size
        self.workers = [self._dealer(b"\x00w%d" % r, f"node{r}") for r in range(world)]
        self.driver = self._dealer(f"drv:{name}/0001".encode(), "analyst")
        for rank, w in enumerate(self.workers):
            w.send_multipart(
                to_wire(encode(WorkerHello(rank, f"i{rank}", 1, "h", "tcp://x:1", "")))
            )
        self.driver.send_multipart(to_wire(encode(OpenSession(1, "", 600.0, name))))
        self.sid = self._next(self.driver, SessionOpened).session
        builder = GraphBuilder(world)
        on = tuple(range(world)) if ranks is None else ranks
        self.graph = builder.build(builder.op("constant", [], ranks=on, value=1))
        self.driver.send_multipart(to_wire(encode(Program(self.graph.digest, self.graph))))
        self.jobs = 0

    def _dealer(self, identity: bytes, party: str = "") -> zmq.Socket[Any]:
        """A DEALER of routing id ``identity`` on the broker (with ``party``'s key if the
        scene has one), closed with the scene."""
        sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, identity)
        if party in self.curves:
            self.curves[party].dial(sock, self.spec.broker_key)
        sock.connect(self.broker.address)
        self.socks.append(sock)
        return sock

    def _next(self, sock: zmq.Socket[Any], kind: type[Any], count: Any = None) -> Any:
        return turned_until(self.broker, sock, kind, count, self.turns)

    def close(self) -> None:
        for sock in self.socks:
            sock.close(linger=0)
        self.broker.close()
        self.ctx.term()
