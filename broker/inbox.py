"""The broker's receive side past the loop: a message the loop in
:meth:`mpl.broker.daemon.Broker._turn` does not read itself, read and handed to the state.

The loop reads the one-part messages of the hot path itself (a repeat Done or Exec, most);
the rest comes here: :meth:`Inbox._route` takes a message of any shape (its frames as
received), :meth:`Inbox._handle` decodes what the hot readers do not take and hands it to
the state, and a batch that arrives (``mpl.wire.batch``) is split and each message in it
handled as if it had come alone (:meth:`Inbox._batch`). A sender's Execs of one program
differ in their job ids alone: each is read by comparing it with that sender's last one
read in full (``mpl.wire.exec_repeat``, a reader per sender, bounded: :meth:`Inbox._exec_of`),
and a worker's Dones likewise (``mpl.wire.done_repeat``: :meth:`Inbox._done_reader`).

A mixin of :class:`mpl.broker.daemon.Broker`, as :class:`mpl.broker.outbox.Outbox` (the
send side) is: the methods here are the broker's own, reading the same socket and state. It
comes last among the broker's bases, so its placeholders below never hide the real methods.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from mpl.broker.calls import JobCall
from mpl.broker.ledger import JobLedger
from mpl.broker.state import BrokerState, Send
from mpl.wire.batch import batch_headers, is_batch
from mpl.wire.codec import MAGIC_FRAME, SLICE_BELOW, decode, from_wire
from mpl.wire.done_repeat import RepeatDones
from mpl.wire.errors import ProtocolError
from mpl.wire.exec_repeat import RepeatExecs
from mpl.wire.hot import (
    DONE_PREFIX,
    EXEC_PREFIX,
    DoneRead,
    read_done_header,
    read_exec,
    read_hot,
    read_hot_header,
)
from mpl.wire.identity import USER_ID
from mpl.wire.jobs import Exec
from mpl.wire.limits import MAX_CONTAINERS
from mpl.wire.logs import RefusalLog
from mpl.wire.record import Record
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, SealedExecReaders

__all__ = ["KEPT_FRAME_BELOW", "Inbox"]

_Frame = zmq.Frame
_frame_get: Any = zmq.Frame.get  # a received frame's property: its User-Id (mpl.wire.identity)
_SEALED_LEN = len(SEALED_EXEC_MAGIC)
# senders whose last Exec is kept to read the next by comparison (mpl.wire.exec_repeat), at
# most; the oldest goes first. Each keeps one header shorter than _KEPT_BELOW, as the objects
# it was read into: a hostile header of empty containers builds ~75 bytes of objects per
# byte, so 64 x 1 KiB keep under 5 MB whoever sends them (a 2p job's header: 130-260 bytes;
# a longer one is read in full each time, as before the readers)
_EXEC_READERS = 64
_KEPT_BELOW = 1024
KEPT_FRAME_BELOW = len(MAGIC_FRAME) + _KEPT_BELOW  # the same, for a frame as received
# senders whose last Done is kept to read the next by comparison (mpl.wire.done_repeat), at
# most (a rank's worker each; the oldest goes first): each keeps under 20 KB of objects
# (RepeatDones.keep), so 256 keep under 6 MB whoever sends them
_DONE_READERS = 256


class Inbox:
    """The broker's reads of what its loop does not read itself (a mixin:
    :class:`mpl.broker.daemon.Broker` sets these up)."""

    secure: bool
    state: BrokerState
    ledger: JobLedger
    refusals: RefusalLog
    _world_size: int  # the most ranks a job can name
    _jobs: dict[str, JobCall]  # the jobs in flight (the state's own table)
    # what this wake-up asks to send, and what it leaves to account for (Outbox)
    _outbox: list[tuple[Send, list[Any]]]
    _accounts: list[tuple[Callable[[Any, Any], Any], Any, Any]]
    # each sender's last Exec and Done read in full, to read its next by comparison
    _exec_readers: dict[bytes, RepeatExecs]
    _done_readers: dict[bytes, RepeatDones]
    _sealed_execs: SealedExecReaders  # each sender's last sealed Exec, likewise
    monitor: zmq.Socket[Any] | None  # (ConnectionWatch's)
    _peer_fd: dict[bytes, int]

    def _perform(self, actions: list[Send], logged: bool = False) -> None:
        raise NotImplementedError  # (Outbox's)

    def _fan_out(self, actions: list[Send]) -> None:
        raise NotImplementedError  # (Outbox's)

    def _map_peer(self, peer: bytes, part: Any) -> None:
        raise NotImplementedError  # (ConnectionWatch's)

    def _contain(self, peer: bytes | None, msg: Record | None, exc: Exception) -> None:
        raise NotImplementedError  # (the Broker's)

    def _route(self, frames: list[Any], now: float | None = None) -> None:
        """Take one ZeroMQ message from the ROUTER: a message, or a batch of them (each
        handled as if it had arrived alone, with the batch's authenticated identity).
        ``now``: the clock as the wake-up that received it read it (else read here). Its
        routing id comes as bytes (from the loop) or as a ``zmq.Frame``."""
        peer = frames[0]
        if type(peer) is not bytes:
            peer = peer.bytes
        if self.monitor is not None and peer not in self._peer_fd:
            self._map_peer(peer, frames[1])  # its connection, to end it when that closes
        if now is None:
            now = time.monotonic()
        body = frames[1:]
        # the hot messages, header only, are read without the general decode (and, with
        # the codec's magic, are no batch); a Done of the hot path is taken here, with no
        # record built (most leave their job waiting on other ranks: nothing to send)
        try:  # one message's failure stays that message's failure
            # every frame of a message carries its connection's User-Id; in secure mode a
            # message without one (not a received frame) speaks for nobody
            who = None
            if self.secure:
                who = _frame_get(body[0], USER_ID) if type(body[0]) is _Frame else ""
            if len(body) == 1 and type(one := body[0]) is _Frame and len(one) < SLICE_BELOW:
                # the frame's bytes (copied once, kept by the frame), counted, then cut
                # into the magic and the header
                one = one.bytes
                self.state.counters["bytes_routed"] += len(one)
                body = [one[:4], one[4:]]
                read = read_hot_header(*body)
            else:
                # received frames: len() is their size in bytes; a large header is viewed
                self.state.counters["bytes_routed"] += sum(map(len, body))
                body = from_wire(body)
                read = read_hot(body)
            if type(read) is DoneRead:
                actions = self.state.dones.read(peer, read, now, who)
                if actions:
                    self._perform(actions)
                return
        except Exception as exc:
            self._contain(peer, None, exc)
            return
        self._handle(peer, body, now, who, batch_ok=True, read=read)

    def _batch(self, peer: bytes, body: list[Any], now: float, who: str | None) -> None:
        """Handle each message of a batch as if it had arrived alone: a Done or an Exec of
        the hot path read and handed to the state here (as the loop and :meth:`_handle` do
        with one that came alone), anything else through :meth:`_handle`, with what
        ``read_hot`` makes of it."""
        try:
            headers = batch_headers(body)
        except ProtocolError as exc:  # answered and counted as one bad message
            self.state.counters["batches_refused"] += 1
            self.refusals.refused(peer.hex(), f"bad message: {exc}")
            self._perform(self.state.protocol_error(peer, exc), logged=True)
            return
        self.state.counters["batches_received"] += 1
        done_read, exec_read = self.state.dones.read, self.state.exec_read
        received = self.ledger.received
        # the sender's repeat Dones read by comparison, as in _turn
        dones = self._done_readers.get(peer)
        for header in headers:
            # read_hot's checks of a message of the codec's magic and this header, written
            # out: a Done's header read by read_done_header, as read_hot_header would
            read: DoneRead | Exec | None
            if header.startswith(DONE_PREFIX) and len(header) < MAX_CONTAINERS:
                one = MAGIC_FRAME + header  # as the Done would have come alone
                dones = dones or self._done_reader(peer)
                done = dones.repeat(one)
                if done is None:
                    done = read_done_header(header)
                    if done is not None:
                        dones.keep(one, done)
                read = done
                if done is not None:
                    try:  # one message's failure stays that message's failure
                        actions = done_read(peer, done, now, who)
                        if actions:  # most Dones leave their job waiting on other ranks
                            self._perform(actions)
                    except Exception as exc:
                        self._contain(peer, None, exc)
                    continue
            elif header.startswith(EXEC_PREFIX) and len(header) < SLICE_BELOW:
                try:
                    read = exec_ = self._exec_of(peer, header)
                except Exception as exc:  # (it raises nothing: one message's failure)
                    self._contain(peer, None, exc)
                    continue
                if exec_ is not None:  # _handle's Exec case, without its call and tests
                    try:  # one message's failure stays that message's failure
                        self._accounts.append((received, exec_, now))
                        raw = [MAGIC_FRAME, header]
                        actions = exec_read(peer, exec_, now, raw, who)
                        if len(self._jobs) == 1 and not self._outbox:
                            self._fan_out(actions)  # nothing it could be batched with
                        else:
                            self._perform(actions)
                    except Exception as exc:
                        self._contain(peer, exec_, exc)
                    continue
            else:
                read = read_hot_header(MAGIC_FRAME, header)
            self._handle(peer, [MAGIC_FRAME, header], now, who, read=read)

    def _done_reader(self, peer: bytes) -> RepeatDones:
        """A new reader of ``peer``'s repeat Dones (``mpl.wire.done_repeat``), kept for at
        most _DONE_READERS senders (the oldest sender's goes first), and only if ``peer``
        is a registered worker's socket or result channel (where its Dones come from): a
        peer that is neither gets one for this message alone, so Dones from peers that are
        no worker evict no worker's reader."""
        reader = RepeatDones(boxes=self.secure)  # in secure mode each value a new box
        if self.state.registry.worker(peer) is not None:
            readers = self._done_readers
            if len(readers) >= _DONE_READERS:
                del readers[next(iter(readers))]
            readers[peer] = reader
        return reader

    def _exec_of(self, peer: bytes, header: bytes) -> Exec | None:
        """``read_hot_header`` of an Exec's ``header`` (shorter than SLICE_BELOW) from
        ``peer``: a repeat of that sender's last Exec read in full (the same program again:
        most jobs) read by comparing it with that one outside its job id, anything else in
        full and kept for the next (``mpl.wire.exec_repeat``, which reads exactly what
        ``read_exec`` reads). What the comparison gives depends on the bytes alone; who may
        send them is checked per message, after (``BrokerState.exec_read``)."""
        if len(header) >= _KEPT_BELOW:
            return read_exec([MAGIC_FRAME, header])
        readers = self._exec_readers
        reader = readers.get(peer)
        if reader is None:
            if len(readers) >= _EXEC_READERS:  # bounded: the oldest sender's goes
                del readers[next(iter(readers))]
            reader = readers[peer] = RepeatExecs()
        frames = [MAGIC_FRAME, header]
        return reader.repeat(frames) or reader.read_in_full(frames)

    def _handle(
        self,
        peer: bytes,
        body: list[Any],
        now: float,
        who: str | None,
        batch_ok: bool = False,
        read: DoneRead | Exec | None = None,
    ) -> None:
        """Decode one message, hand it to the state, queue what it asks to send; or, if it
        is a batch (and ``batch_ok``: not inside one), each message in it. ``read``: what
        ``read_hot`` made of it (a hot message is not decoded again)."""
        msg: Record | None = None
        try:  # one message's failure stays that message's failure
            if type(read) is DoneRead:  # a Done of the hot path: no record built
                actions = self.state.dones.read(peer, read, now, who)
                if actions:  # most Dones leave their job waiting on other ranks
                    self._perform(actions)
                return
            if (  # a secure Exec, its boxes after its header (is_sealed_exec, written out)
                read is None
                and len(body) == 2
                and len(magic := body[0]) == _SEALED_LEN
                and bytes(magic) == SEALED_EXEC_MAGIC
            ):
                try:
                    if not self.secure:
                        raise ProtocolError("a sealed Exec, to a broker not in secure mode")
                    # header on the lean path (a repeat by comparison), then the boxes (at
                    # most one per cluster rank)
                    read, head, boxes = self._sealed_execs.read(peer, body, self._world_size)
                except ProtocolError as exc:
                    self.refusals.refused(peer.hex(), f"bad message: {exc}")
                    self._perform(self.state.protocol_error(peer, exc), logged=True)
                    return
                # the magic, the header, each rank's box (the state gives each its own)
                raw = [SEALED_EXEC_MAGIC, head, *boxes]
            elif type(read) is Exec:  # an Exec: checked and built without the decoder
                # forwarded as bytes (the header's the read cached, the magic it checked):
                # a short frame costs less to send copied than as a zmq.Frame
                header = body[1]
                raw = [MAGIC_FRAME, header.bytes if hasattr(header, "bytes") else bytes(header)]
            else:
                raw = None
            if raw is not None:
                assert type(read) is Exec
                msg = read
                self._accounts.append((self.ledger.received, read, now))
                actions = self.state.exec_read(peer, read, now, raw, who)
                if len(self._jobs) == 1 and not self._outbox:
                    self._fan_out(actions)  # nothing it could be batched with
                else:
                    self._perform(actions)
                return
            if batch_ok and is_batch(body):
                self._batch(peer, body, now, who)
                return
            try:
                msg = decode(body, unpickle=False)
            except ProtocolError as exc:
                self.refusals.refused(peer.hex(), f"bad message: {exc}")
                self._perform(self.state.protocol_error(peer, exc), logged=True)
                return
            if type(msg) is Exec:  # the only message the ledger notes on arrival
                self._accounts.append((self.ledger.received, msg, now))
            self._perform(self.state.handle(peer, msg, now, body, who=who))
        except Exception as exc:
            self._contain(peer, msg, exc)
