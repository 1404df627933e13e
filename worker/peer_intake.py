"""The worker's peer thread: moves from other ranks, received straight into the mailbox.

Peers are other parties: their messages are decoded in the safe value format (unless this
party declared the cluster trusted), under ``--code kernels`` anything holding a pickle is
refused unread, and in secure mode a move counts only from the rank its connection proved
to be. The thread sleeps until a move arrives or the worker wakes it to stop, so an idle
worker costs no wake-ups here (32 of them may share 2 cores). What it decides beyond
putting a move (a refused move fails its job) goes to the job shell, which answers on the
result channel: never on the I/O thread's socket. It counts and logs in tables of its own,
since neither is thread-safe.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

import zmq

from mpl.wire.codec import frames_nbytes, from_wire
from mpl.wire.curve import PEER_DOMAIN, Curve
from mpl.wire.data import Move
from mpl.wire.errors import ProtocolError
from mpl.wire.guard import Guard
from mpl.wire.logs import RefusalLog
from mpl.wire.record import Record
from mpl.wire.safe_values import WORKER, pickles_allowed
from mpl.wire.sockets import configure, drain
from mpl.worker.code_policy import HoldsPickles, refusal, screen
from mpl.worker.holding import approx_nbytes
from mpl.worker.keyed_mailbox import KeyedMailbox, MoveKey
from mpl.worker.state_events import MoveRefused

__all__ = ["MAX_MOVE_NAME_CHARS", "PeerIntake"]

log = logging.getLogger("mpl.worker")
_BATCH = 256  # moves taken per wake-up
_DEFER, _DEFER_BYTES = 256, 64 << 20  # moves given a second chance (see _put)
_DEFER_SHARE = 4  # one sender takes at most this fraction of them: a flood leaves room
# A move whose session, job or sealer is longer is refused: the holding area counts a
# move's value, not its key, whose strings the sender writes (red team w33, R33-8: 1 MiB
# names were held as a few bytes each). A session id is a name of at most 128 characters
# and a 25-character tail, a job id 24 hex digits, a sealer "driver:" and 64 at most.
MAX_MOVE_NAME_CHARS = 256


class PeerIntake:
    """The PULL socket peers send moves to (bound at ``bind``) and the thread reading it.

    ``report`` takes the event of a move the code policy refused (its job fails).
    """

    def __init__(
        self,
        ctx: zmq.Context[Any],
        bind: str,
        rank: int,
        mailbox: KeyedMailbox[MoveKey, tuple[str, str]],
        report: Callable[[Any], None],
        *,
        curve: Curve | None,
        trusted: bool,
        code: str,
        max_message: int,
    ) -> None:
        self.rank = rank
        self.mailbox = mailbox
        self.curve = curve
        self.trusted = trusted
        self.code = code
        self._report = report  # a refused move's event, for the job shell
        self.pull = configure(ctx.socket(zmq.PULL), max_message=max_message)
        if curve is not None:
            curve.serve(self.pull, PEER_DOMAIN)
        self.pull.bind(bind)
        self.address: str = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
        # the I/O thread wakes this thread through a pair when the worker stops
        self._woken = configure(ctx.socket(zmq.PAIR), linger_ms=0)
        wake = f"inproc://mpl-worker-{rank}-wake-{secrets.token_hex(8)}"
        self._woken.bind(wake)
        self._wake = configure(ctx.socket(zmq.PAIR), linger_ms=0)
        self._wake.connect(wake)
        self.bytes_in = 0
        self.errors = 0
        self._refusals = RefusalLog(log)
        self.faults: dict[str, int] = {}
        self._guard = Guard(log, self.faults)
        # moves waiting for room; the I/O thread looks at it after every message, without
        # the lock (a list's truth is read whole) and without a call
        self.deferred: list[tuple[MoveKey, Any, int]] = []
        self._deferred_bytes = 0
        self._deferred_by: dict[int, list[int]] = {}  # src: [moves, bytes] deferred
        self._deferred_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._serve, name=f"mpl-worker-{self.rank}-peers", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Wake the thread and wait for it (at most ``timeout``)."""
        if self._thread is None:
            return
        try:
            self._wake.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            log.debug("rank %d: could not wake the peer thread", self.rank)
        self._thread.join(timeout)

    def close(self) -> None:
        """Close the sockets (after :meth:`stop`, or when the thread never started)."""
        for sock in (self.pull, self._wake, self._woken):
            sock.close()

    def _serve(self) -> None:
        items = [(self.pull, zmq.POLLIN), (self._woken, zmq.POLLIN)]
        while True:
            try:
                ready = zmq.zmq_poll(items, -1)
            except zmq.ZMQError as exc:  # the context went away under us
                log.debug("rank %d: the peer thread ends: %s", self.rank, exc)
                return
            if any(sock is self._woken for sock, _ in ready):
                return
            for frames in drain(self.pull, _BATCH):
                self._on_frames(frames)

    def _on_frames(self, frames: list[Any]) -> None:
        try:
            msg = screen(
                from_wire(frames), self.code, safe=not pickles_allowed(WORKER, trusted=self.trusted)
            )
        except ProtocolError as exc:
            self.errors += 1
            self._refusals.refused("a peer", f"dropped a bad message: {exc}")
            return
        if isinstance(msg, HoldsPickles):
            self._refuse(msg.opaque, frames[0])
            return
        self.bytes_in += frames_nbytes(frames)
        if self.curve is not None and not self._from_src(msg, frames[0]):
            return
        try:  # one message's failure stays that message's failure
            self._put(msg)
        except Exception as exc:
            self._guard.internal("a peer", msg, exc, rank=self.rank)

    def _refuse(self, opaque: Record, frame: zmq.Frame) -> None:
        """``--code kernels``: refuse a message holding pickles, with nothing unpickled (see
        ``code_policy.py``).

        A peer speaks only for its own move to this rank (in secure mode, from the rank its
        connection proved to be): only then does the refusal fail that move's job. A program
        or job record, or a move for another rank, is counted and dropped: on a peer's word
        it would fail work of this rank that the peer has no part in.
        """
        event = refusal(opaque, self.rank)
        if not isinstance(event, MoveRefused):
            self.errors += 1
            log.warning("rank %d: a peer sent a %s holding pickles", self.rank, opaque.TAG)
        elif self.curve is None or self._from_src(opaque, frame):
            self._report(event)

    def _from_src(self, msg: Record, frame: zmq.Frame) -> bool:
        """Secure mode: a move counts only from the rank its connection proved to be."""
        sender = self.curve.sender_rank(frame) if self.curve is not None else None
        if isinstance(msg, Move) and sender == msg.src:
            return True
        self.errors += 1
        log.warning(
            "rank %d: dropped a %s claiming src %s from rank %s",
            self.rank,
            msg.TAG,
            getattr(msg, "src", "?"),
            sender,
        )
        return False

    def _put(self, msg: Record) -> None:
        if not isinstance(msg, Move) or msg.dst != self.rank:
            self.errors += 1
            self._refusals.refused("a peer", f"unexpected {msg.TAG} on the peer socket")
            return
        if (
            len(msg.session) > MAX_MOVE_NAME_CHARS
            or len(msg.job) > MAX_MOVE_NAME_CHARS
            or len(msg.sealer) > MAX_MOVE_NAME_CHARS
        ):
            self.errors += 1
            self._refusals.refused(f"rank {msg.src}", "dropped a move with an oversized name")
            return
        key = (msg.session, msg.job, msg.op, msg.seq, msg.src, msg.sealer)
        mailbox = self.mailbox
        dropped, unexpected, over = mailbox.held_dropped, mailbox.unexpected, mailbox.over_shares
        if mailbox.put(key, msg.value):
            return
        if mailbox.unexpected != unexpected or mailbox.over_shares != over:
            # a move its job's program does not take, or past its sender's share: that
            # sender's protocol error (its connection proved its rank in secure mode)
            self.errors += 1
            what = (
                "not one its job's program takes"
                if mailbox.unexpected != unexpected
                else "past that rank's share of the moves waiting here"
            )
            self._refusals.refused(f"rank {msg.src}", f"dropped a move {what}")
            return
        if mailbox.held_dropped == dropped:
            return
        self._refusals.refused(
            f"rank {msg.src}",
            "a move for a job not known here was dropped: that rank's share of the holding "
            "area, or the area itself, is full (worker/holding.py)",
        )
        # No room to hold a move for a job not opened yet. It may have overtaken its Exec,
        # which may sit on the I/O thread's socket right now (a thread that handled both
        # sockets took the Exec first): the I/O thread puts it once more after its next
        # message (put_deferred). Bounded in entries and bytes, and one sender takes at most
        # a quarter of either, so a party flooding moves cannot take another's second
        # chance; past that the drop stands.
        size = approx_nbytes(msg.value)
        with self._deferred_lock:
            mine = self._deferred_by.get(msg.src, [0, 0])
            if (
                len(self.deferred) < _DEFER
                and self._deferred_bytes + size <= _DEFER_BYTES
                and mine[0] < _DEFER // _DEFER_SHARE
                and mine[1] + size <= _DEFER_BYTES // _DEFER_SHARE
            ):
                self.deferred.append((key, msg.value, size))
                self._deferred_bytes += size
                self._deferred_by[msg.src] = [mine[0] + 1, mine[1] + size]

    def put_deferred(self) -> None:
        """Called by the I/O thread after a message or the timers: the moves this thread had
        no room for, put once more (their Exec may have opened their job meanwhile)."""
        with self._deferred_lock:
            moves, self.deferred = self.deferred, []
            self._deferred_bytes = 0
            self._deferred_by.clear()
        for key, value, _size in moves:
            self.mailbox.put(key, value)
