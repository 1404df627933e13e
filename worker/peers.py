"""Outgoing peer links: one PUSH socket per destination rank, connected on first use.

Job threads send on these directly (each socket behind its own lock), so a large move never
waits for the I/O thread. Addresses come from the broker's directory; when a peer comes
back with a new address, its socket is replaced. In secure mode each socket pins the
destination rank's key from this worker's own spec, not the directory's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from mpl.wire.codec import encode, frames_nbytes
from mpl.wire.control import PeerInfo
from mpl.wire.curve import Curve
from mpl.wire.data import Move
from mpl.wire.errors import JobAbortedError, MplTimeoutError, WorkerLostError
from mpl.wire.sockets import configure, send_frames

__all__ = ["PeerLinks"]

_RETRY_S = 0.05


class _Link:
    def __init__(self, sock: zmq.Socket[Any], addr: str) -> None:
        self.sock = sock
        self.addr = addr
        self.lock = threading.Lock()


class PeerLinks:
    """``safe``: moves are written in the safe value format (``mpl.wire.safe_values``); off
    only in a trusted cluster, where they may carry pickles."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        directory: Callable[[], dict[int, PeerInfo]],
        *,
        safe: bool = True,
        curve: Curve | None = None,
    ) -> None:
        self._ctx = ctx
        self.safe = safe
        self._curve = curve
        self._directory = directory
        self._links: dict[int, _Link] = {}
        self._lock = threading.Lock()
        self.bytes_out = 0

    def send(self, move: Move, deadline: float, aborted: Callable[[], str | None]) -> None:
        """Queue ``move`` to its destination; raises instead of blocking past ``deadline``."""
        link = self._link(move.dst)
        frames = encode(move, safe=self.safe)
        while True:
            # the lock is taken with a timeout: another send to this peer may be stuck too
            if link.lock.acquire(timeout=_RETRY_S):
                try:
                    send_frames(link.sock, frames)
                    break
                except zmq.Again:  # the peer's queue is full: wait, but not forever
                    pass
                finally:
                    link.lock.release()
            reason = aborted()
            if reason is not None:
                raise JobAbortedError(f"job aborted: {reason}")
            if time.monotonic() > deadline:
                raise MplTimeoutError(
                    f"rank {move.dst} did not take a move in time (its queue is full)"
                )
            time.sleep(_RETRY_S)
        self.bytes_out += frames_nbytes(frames)

    def _link(self, dst: int) -> _Link:
        peer = self._directory().get(dst)
        if peer is None:
            raise WorkerLostError(f"rank {dst} is not in the broker's directory", rank=dst)
        with self._lock:
            link = self._links.get(dst)
            if link is not None and link.addr == peer.data_addr:
                return link
            if link is not None:
                with link.lock:
                    link.sock.close(linger=0)
            sock = configure(self._ctx.socket(zmq.PUSH))
            if self._curve is not None:
                self._curve.dial(sock, self._curve.node_key(dst))
            sock.connect(peer.data_addr)
            link = self._links[dst] = _Link(sock, peer.data_addr)
            return link

    def close(self) -> None:
        with self._lock:
            for link in self._links.values():
                with link.lock:
                    link.sock.close()
            self._links.clear()
