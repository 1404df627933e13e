"""Outgoing peer links: moves to other ranks, one PUSH socket per destination rank.

Addresses come from the broker's directory; sockets, key pinning and the bounded send are
:mod:`mpl.worker.push_pool`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from mpl.wire.codec import encode, frames_nbytes, to_wire
from mpl.wire.control import PeerInfo
from mpl.wire.curve import Curve
from mpl.wire.data import Move
from mpl.wire.errors import JobAbortedError, MplTimeoutError, WorkerLostError
from mpl.wire.limits import MAX_MESSAGE
from mpl.wire.sockets import first_oversized, too_large
from mpl.worker.push_pool import PushPool, send_until

__all__ = ["PeerLinks"]

_RETRY_S = 0.05


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
        max_message: int = MAX_MESSAGE,
    ) -> None:
        self.safe = safe
        self.max_message = max_message  # a bigger frame would drop the link: refused here
        self._directory = directory
        self._pool = PushPool(ctx, curve)
        self.bytes_out = 0

    def send(self, move: Move, deadline: float, aborted: Callable[[], str | None]) -> None:
        """Queue ``move`` to its destination; raises instead of blocking past ``deadline``."""
        dst = move.dst
        peer = self._directory().get(dst)
        if peer is None:
            raise WorkerLostError(f"rank {dst} is not in the broker's directory", rank=dst)
        link = self._pool.link(dst, peer.data_addr)
        frames = to_wire(encode(move, safe=self.safe))
        if size := first_oversized(frames, self.max_message):
            what = f"the move from rank {move.src} to rank {dst} (op {move.op})"
            raise too_large(what, size, self.max_message, f"rank {dst}")
        send_until(
            link,
            frames,
            deadline=deadline,
            retry_s=_RETRY_S,
            stopped=aborted,
            failure=lambda reason: _not_taken(dst, reason),
        )
        self.bytes_out += frames_nbytes(frames)

    def close(self) -> None:
        self._pool.close()


def _not_taken(dst: int, reason: str | None) -> Exception:
    if reason is not None:
        return JobAbortedError(f"job aborted: {reason}")
    return MplTimeoutError(f"rank {dst} did not take a move in time (its queue is full)")
