"""The broker's send side: what a wake-up's messages ask to send, queued, then sent at its
end, each peer's messages in order, and only then accounted for.

A mixin of :class:`mpl.broker.daemon.Broker` (its receive side and timers stay there): the
methods here are the broker's own, reading the same socket, state, ledger and guard. A run
of hot header-only messages to one peer goes as one batch (``mpl.wire.batch``); the Exec of
a job alone in flight goes to its ranks at once (:meth:`Outbox._fan_out`). A header-only
message goes out as one frame, its magic and header joined (wire v4), through the compiled
socket's own send.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import zmq

from mpl.broker.ledger import JobLedger
from mpl.broker.state import BrokerState, Send
from mpl.wire.batch import coalesce
from mpl.wire.codec import encode, to_wire
from mpl.wire.control import Directory, Heartbeat, Refused
from mpl.wire.guard import Guard
from mpl.wire.jobs import Exec, JobResult
from mpl.wire.logs import RefusalLog
from mpl.wire.sockets import send_frames

__all__ = ["Outbox"]

# The compiled socket's own send: the broker calls it directly for what it sends on every job
_raw_send: Any = zmq.backend.Socket.send
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = _NOBLOCK | int(zmq.SNDMORE)
_COPY_BELOW = 64 * 1024  # pyzmq's copy threshold (mpl.wire.sockets.send_frames)
# What may ride in a batch: the hot messages (Exec to a worker, JobResult to a driver).
# Anything else goes alone, so the sockets that never see these (the driver's heartbeat
# socket) never see a batch either.
_BATCHABLE = frozenset({Exec, JobResult})
# What the broker sends that the ledger counts or the log shows; nothing else needs a look
_OBSERVED = frozenset({Refused, JobResult})
_first = itemgetter(0)
_UNSEEN = object()  # no message's frames are this object

log = logging.getLogger("mpl.broker")


class Outbox:
    """The broker's sends (a mixin: :class:`mpl.broker.daemon.Broker` sets these up)."""

    router: zmq.Socket[Any]
    state: BrokerState
    ledger: JobLedger
    refusals: RefusalLog
    guard: Guard
    # what this wake-up asks to send: (action, its frames), in order
    _outbox: list[tuple[Send, list[Any]]]
    # the accounting the sends do not wait for: (what does it, its action, its argument)
    _accounts: list[tuple[Callable[[Any, Any], Any], Any, Any]]
    # the ledger's clock and the wall clock as the answers being accounted for went out
    _clocks: tuple[float, float] | None = None

    def _fan_out(self, actions: list[Send]) -> None:
        """Send a job's Exec to its ranks at once, as the state asked, when nothing else is
        queued (its sends would go first) and no other job is in flight (nothing could be
        batched with them): the outbox, its grouping by peer and its loop are skipped.
        From the first action that is no header-only Exec (a rank's program, a refusal)
        on, the rest are queued the ordinary way."""
        router: Any = self.router
        if not isinstance(router, zmq.backend.Socket):
            self._perform(actions)
            return
        send = _raw_send
        checked: Any = _UNSEEN  # the frames last checked (the ranks of a fan share them)
        for at, action in enumerate(actions):
            peer, msg, frames = action
            if frames is not checked:
                if type(msg) is not Exec or frames is None or type(frames[1]) is not bytes:
                    self._perform(actions[at:])
                    return
                checked, whole = frames, frames[0] + frames[1]  # one frame (wire v4)
                copy = len(whole) < _COPY_BELOW
            try:
                send(router, peer, _MORE)
                send(router, whole, _NOBLOCK, copy)
            except Exception as exc:
                self._unsent(peer, ((action, frames),), exc)

    def _observe(self, action: Send, logged: bool) -> None:
        """Metrics and log lines for what the broker has just sent (or found it could not
        deliver: the ledger counts a job's answer either way)."""
        msg = action.msg
        if type(msg) is Refused:
            if not logged:
                self.refusals.refused(action.peer.hex(), msg.error.message, kind=msg.error.kind)
            return
        clocks = self._clocks
        if clocks is None:  # the answers a flush sent went out together: one reading
            clocks = self._clocks = (self.ledger.clock(), time.time())
        span = self.ledger.sent(msg, action.raw, clocks)
        if span is not None and span.outcome != "ok":
            log.info(
                "job %s ended: %s",
                span.job,
                span.outcome,
                extra={"session": span.session, "job": span.job},
            )

    def _perform(self, actions: list[Send], logged: bool = False) -> None:
        """Queue what the state asks to send; :meth:`_flush` sends it at the end of the
        wake-up, when the queue holds all that this wake-up's messages asked for, then
        observes it."""
        encoded: dict[int, list[Any]] = {}  # broadcasts are encoded once
        outbox = self._outbox
        for action in actions:
            msg, frames = action.msg, action.raw
            if type(msg) in _OBSERVED:
                self._accounts.append((self._observe, action, logged))
            if frames is None:
                frames = encoded.get(id(msg))
                if frames is None:
                    frames = encoded[id(msg)] = encode(msg)
            outbox.append((action, frames))

    def _flush(self) -> None:
        """Send what is queued, each peer's messages in the order they were queued; a run
        of hot header-only messages to one peer goes as one batch (``mpl.wire.batch``).
        Then account for it: the ledger and the log."""
        while self._outbox:
            queued, self._outbox = self._outbox, []
            if len(queued) == 1:  # one job at a time: no grouping to do
                action, frames = queued[0]
                self._send_to(action.peer, frames, queued)
                continue
            if len(set(map(_first, map(_first, queued)))) == len(queued):
                # a message to each peer (an Exec to every rank): nothing to group or batch;
                # _send_to written out for the header-only messages of a compiled socket
                router: Any = self.router
                if not isinstance(router, zmq.backend.Socket):
                    for item in queued:
                        self._send_to(item[0].peer, item[1], (item,))
                    continue
                for item in queued:
                    action, frames = item
                    if len(frames) != 2 or type(header := frames[1]) is not bytes:
                        self._send_to(action.peer, frames, (item,))
                        continue
                    whole = frames[0] + header  # one frame (wire v4)
                    try:
                        _raw_send(router, action.peer, _MORE)
                        _raw_send(router, whole, _NOBLOCK, len(whole) < _COPY_BELOW)
                    except Exception as exc:
                        self._unsent(action.peer, (item,), exc)
                continue
            by_peer: dict[bytes, list[tuple[Send, list[Any]]]] = {}
            for item in queued:
                by_peer.setdefault(item[0].peer, []).append(item)
            for peer, items in by_peer.items():
                if len(items) == 1:
                    self._send_to(peer, items[0][1], items)
                    continue
                plan = coalesce([(frames, type(a.msg) in _BATCHABLE) for a, frames in items])
                at = 0
                for frames, carried in plan:
                    if carried > 1:
                        self.state.counters["batches_sent"] += 1
                    self._send_to(peer, frames, items[at : at + carried])
                    at += carried
        # The accounting the sends did not wait for, in the order it arose (written out
        # here: a call fewer per wake-up). One failure is counted and logged; it neither
        # stops the loop nor skips the rest.
        if self._accounts:
            accounts, self._accounts = self._accounts, []
            self._clocks = None  # read by the first answer accounted for (_observe)
            for account, item, arg in accounts:
                try:
                    account(item, arg)
                except Exception as exc:
                    self.guard.internal("the ledger", None, exc)

    def _send_to(self, peer: bytes, frames: list[Any], carried: Sequence[tuple[Send, Any]]) -> None:
        """Send one message (maybe a batch) to ``peer``; what it carried is undeliverable
        if the peer is gone or stuck (what follows from that is queued for the flush)."""
        router: Any = self.router
        try:
            if (
                len(frames) == 2
                and type(header := frames[1]) is bytes
                and isinstance(router, zmq.backend.Socket)
            ):  # send_frames written out for a header-only message (a job's answer)
                whole = frames[0] + header  # one frame (wire v4)
                _raw_send(router, peer, _MORE)
                _raw_send(router, whole, _NOBLOCK, len(whole) < _COPY_BELOW)
            else:
                send_frames(router, [peer, *to_wire(frames)])
        except Exception as exc:
            self._unsent(peer, carried, exc)

    def _unsent(self, peer: bytes, carried: Sequence[tuple[Send, Any]], exc: Exception) -> None:
        """A send to ``peer`` failed: when it is gone or stuck, what it carried is
        undeliverable; anything else is counted and logged."""
        if not isinstance(exc, zmq.ZMQError) or exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
            self.guard.internal(peer.hex(), carried[0][0].msg, exc)
            return
        for action, _ in carried:
            self._perform(self._undeliverable(action, exc))

    def _undeliverable(self, action: Send, exc: zmq.ZMQError) -> list[Send]:
        """The peer is gone (or stuck): its calls fail back to their senders."""
        routine = isinstance(action.msg, (Heartbeat, Directory))
        log.log(
            logging.INFO if routine else logging.WARNING,
            "cannot deliver %s to %s: %s",
            action.msg.TAG,
            action.peer.hex(),
            exc,
        )
        if not routine:
            self.state.errors.append(f"undeliverable {action.msg.TAG}: {exc.strerror}")
        return self.state.disconnected(action.peer, time.monotonic())
