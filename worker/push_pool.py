"""Outgoing PUSH sockets to other workers, one per destination rank, and the bounded send.

Both kinds of worker-to-worker traffic use this: moves (:mod:`mpl.worker.peers`) and libspu
messages (:mod:`mpl.worker.spu_link`). A socket is connected on first use and replaced when
the destination's address changes (the peer came back elsewhere). In secure mode each
socket pins the destination rank's key from this worker's own spec, never the directory's.

Job threads send directly, each socket behind its own lock, so a large send never waits for
the I/O thread; :func:`send_until` never blocks past the job's deadline or abort.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from mpl.wire.curve import Curve
from mpl.wire.sockets import configure, send_frames

__all__ = ["PushLink", "PushPool", "send_until"]


class PushLink:
    """One connected PUSH socket; ``lock`` serialises the job threads sending on it."""

    __slots__ = ("addr", "lock", "sock")

    def __init__(self, sock: zmq.Socket[Any], addr: str) -> None:
        self.sock = sock
        self.addr = addr
        self.lock = threading.Lock()


class PushPool:
    """The PUSH sockets of one kind of traffic, keyed by destination rank."""

    def __init__(self, ctx: zmq.Context[Any], curve: Curve | None = None) -> None:
        self._ctx = ctx
        self._curve = curve
        self._links: dict[int, PushLink] = {}
        self._lock = threading.Lock()

    def link(self, dst: int, addr: str) -> PushLink:
        """The socket to rank ``dst`` at ``addr``, connecting (or reconnecting) it first."""
        with self._lock:
            link = self._links.get(dst)
            if link is not None and link.addr == addr:
                return link
            if link is not None:  # the rank moved: what is still queued for the old one goes
                with link.lock:
                    link.sock.close(linger=0)
            sock = configure(self._ctx.socket(zmq.PUSH))
            if self._curve is not None:
                self._curve.dial(sock, self._curve.node_key(dst))
            sock.connect(addr)
            link = self._links[dst] = PushLink(sock, addr)
            return link

    def close(self) -> None:
        """Close every socket (with the standard bounded LINGER)."""
        with self._lock:
            for link in self._links.values():
                with link.lock:
                    link.sock.close()
            self._links.clear()


def send_until(
    link: PushLink,
    frames: Sequence[Any],
    *,
    deadline: float,
    retry_s: float,
    stopped: Callable[[], str | None],
    failure: Callable[[str | None], Exception],
) -> None:
    """Queue ``frames`` on ``link`` without blocking past ``deadline`` or a stop.

    A destination that died (or stopped reading) fills its queue; then this retries every
    ``retry_s`` and, between tries, raises ``failure(reason)`` as soon as ``stopped()`` gives
    a reason, or ``failure(None)`` once ``deadline`` (``time.monotonic()``) has passed. The
    lock is taken with a timeout too: another send to the same rank may be stuck.
    """
    while True:
        if link.lock.acquire(timeout=retry_s):
            try:
                send_frames(link.sock, frames)  # NOBLOCK
                return
            except zmq.Again:  # the destination's queue is full: wait, but not forever
                pass
            finally:
                link.lock.release()
        reason = stopped()
        if reason is not None:
            raise failure(reason)
        if time.monotonic() > deadline:
            raise failure(None)
        time.sleep(retry_s)
