"""The worker's link to the broker (a part of the worker): its sockets, the watch on the
CURVE handshake, and sending from the I/O thread.

:class:`BrokerLink` is the half of :class:`~mpl.worker.daemon.Worker` that builds the
DEALERs to the broker (pinned to the broker key of the worker's OWN spec in secure mode),
watches the result socket's handshakes so that a broker which refuses this worker's key
ends it at once rather than being retried for ever, and encodes and sends on the I/O
thread's dealer. The loop that receives is ``daemon.py``'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import zmq

from mpl.wire.codec import encode, to_wire
from mpl.wire.curve import Curve
from mpl.wire.errors import MessageTooLargeError
from mpl.wire.guard import Guard, substitute
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.safe_values import WORKER, pickles_allowed
from mpl.wire.sockets import configure, drain, encoded_oversized, send_frames, too_large

if TYPE_CHECKING:  # secure mode's: not imported on a plain start
    from mpl.worker.sealing import WorkerSeal
    from mpl.worker.state import WorkerState

__all__ = ["BrokerLink"]

log = logging.getLogger("mpl.worker")
# what a failed handshake of the result socket reports (secure mode)
_HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class BrokerLink:
    """The worker's sockets to the broker and its sends on them (mixed into ``Worker``,
    which sets these attributes)."""

    ctx: zmq.Context[Any]
    broker_url: str
    rank: int
    curve: Curve | None
    trusted: bool
    seal: WorkerSeal | None
    state: WorkerState
    guard: Guard
    dealer: zmq.Socket[Any]
    refused: ErrorInfo | None
    _max_message: int
    _send_limit: int
    _stopping: bool
    _results: zmq.Socket[Any]
    _handshakes: zmq.Socket[Any] | None

    def _broker_socket(self) -> zmq.Socket[Any]:
        sock = configure(self.ctx.socket(zmq.DEALER), max_message=self._max_message)
        if self.curve is not None:
            self.curve.dial(sock, self.curve.broker)  # the broker key of OUR spec
        return sock

    def _new_dealer(self) -> zmq.Socket[Any]:
        sock = self._broker_socket()
        sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing towards a broker that is not there
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.connect(self.broker_url)
        return sock

    # -- the handshake watch (secure mode) ------------------------------------------------
    def _watch_handshakes(self) -> None:
        """A broker that refuses our key says so only in the handshake, so watch it (on
        the result socket, which lives as long as the worker) and give up at once."""
        self._handshakes = None
        if self.curve is not None:
            self._handshakes = self._results.get_monitor_socket(_HANDSHAKE_FAILURES)

    def _drain_handshakes(self) -> None:
        """The timers' look at the handshake watch (secure mode: ``_handshakes`` set)."""
        watch = self._handshakes
        if watch is None:
            return
        for event in drain(watch):
            self._handshake_failed([frame.bytes for frame in event])

    def _close_handshakes(self) -> None:
        """Under the result channel's lock, before the result socket closes."""
        if self._handshakes is not None:
            self._results.disable_monitor()
            self._handshakes.close(linger=0)

    def _handshake_failed(self, event: list[bytes]) -> None:
        if self.state.joined:
            return  # a welcomed worker keeps retrying: the broker may come back
        auth = int.from_bytes(event[0][:2], "little") == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        why = (
            "refused this worker's key (it is not a node key in the broker's cluster spec)"
            if auth
            else "failed the CURVE handshake (it does not run CURVE, or it is not the "
            "broker whose key this worker's spec pins)"
        )
        self.refused = ErrorInfo(
            "AuthenticationError", f"the broker at {self.broker_url} {why}", rank=self.rank
        )
        log.error("rank %d: %s", self.rank, self.refused.message)
        self._stopping = True

    # -- sending ----------------------------------------------------------------------------
    def _send(self, msg: Record) -> None:
        """Send to the broker from the I/O thread; dropped if the broker is unreachable."""
        if self.seal is not None:
            msg = self.seal.outbound(msg)
        frames = self._encode(msg)
        if frames is None:
            return
        try:
            send_frames(self.dealer, to_wire(frames))
        except zmq.Again:
            log.debug("rank %d: broker unreachable, dropped %s", self.rank, msg.TAG)

    def _encode(self, msg: Record) -> list[Any] | None:
        """``msg``'s frames; if it cannot be encoded (a result that does not pickle, or is
        not in the safe value format), the same answer carrying the error instead, so the
        one waiting learns why.

        Everything a worker sends travels on to the broker or a driver, other parties: in
        the safe value format unless this party declared the cluster trusted."""
        safe = not pickles_allowed(WORKER, trusted=self.trusted)
        try:
            frames = encode(msg, safe=safe)
            if size := encoded_oversized(frames, self._send_limit):
                job = getattr(msg, "job", "")  # a Done's; a fetch's Reply names no job
                what = f"the result of job {job}" if job else f"the {msg.TAG!r} answer"
                if msg.TAG == "reply":
                    what = "the answer to a fetch"
                what += f" on rank {self.rank}"
                raise too_large(what, size, self._send_limit, "the broker")
            return frames
        except MessageTooLargeError as exc:  # the broker would drop it, with the connection
            log.warning("rank %d: %s", self.rank, exc)
            instead = substitute(msg, exc, self.rank)
            return encode(instead, safe=safe) if instead is not None else None
        except Exception as exc:
            self.guard.internal("this worker", msg, exc)
            instead = substitute(msg, exc, self.rank)
            return encode(instead, safe=safe) if instead is not None else None

    def _unanswered(self, seconds: float) -> str:
        """What to check when the broker does not answer this worker's hellos."""
        mode = (
            "this worker runs CURVE: check that the broker does too, with the key your spec "
            "pins as broker.curve_key"
            if self.curve is not None
            else "this worker runs plaintext: a secure broker answers only a worker started "
            "with --key and --cluster"
        )
        return (
            f"no answer from the broker at {self.broker_url} for {seconds:.0f} s; still "
            f"trying. Is mpl-broker running at that address? ({mode})"
        )
