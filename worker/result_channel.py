"""How the worker's answers leave: the result channel (a part of the worker).

:class:`ResultChannel` is the half of :class:`~mpl.worker.daemon.Worker` that sends what
the job threads and the I/O thread answer (Dones, Faileds, replies, progress) on the
result channel: a second DEALER to the broker behind a lock, announced with ``Channel``,
so that no answer waits for the I/O thread. While the I/O thread handles a batch of the
broker's messages, the Dones of the jobs it runs inline gather and go out in batches
(``mpl.wire.batch``). An inline run's ``Done``, packed by the job shell itself (plaintext,
or its small scalars sealed), goes out as one frame (wire v4: the magic and the header)
by the compiled send, on the I/O thread's own dealer (the connection its Exec came on).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from mpl.wire.batch import coalesce, header_only
from mpl.wire.codec import decode, encode, to_wire
from mpl.wire.control import Channel
from mpl.wire.done_pack import own_done_frames
from mpl.wire.guard import substitute
from mpl.wire.jobs import Done
from mpl.wire.record import Record
from mpl.wire.sockets import send_frames, too_large

if TYPE_CHECKING:  # secure mode's: not imported on a plain start
    from mpl.worker.sealing import WorkerSeal

__all__ = ["ResultChannel"]

log = logging.getLogger("mpl.worker")
# the compiled send, as mpl.wire.sockets calls it, with plain ints for flags (`int |
# IntFlag` builds an enum each time)
_raw_send = zmq.backend.Socket.send
_NOBLOCK = int(zmq.NOBLOCK)


class ResultChannel:
    """The worker's sending of answers (mixed into ``Worker``, which sets these
    attributes and encodes records)."""

    rank: int
    incarnation: str
    seal: WorkerSeal | None
    dealer: zmq.Socket[Any]
    _results: zmq.Socket[Any]
    _results_lock: threading.Lock
    _closed: bool
    _channel_owed: bool
    _io_thread: int
    _gathered: list[list[Any]] | None
    _encode: Callable[[Record], list[Any] | None]
    _send_limit: int  # the broker's limit and ours, the lesser: see BrokerLink._encode

    def _post(self, msg: Record) -> None:
        """Send to the broker from any thread, on the result channel."""
        if self.seal is not None:  # its values sealed into bytes (plain values too)
            msg = self.seal.outbound(msg)
        # a Done of plain values (most) is packed without the general encoder; the job
        # shell built its stats, metas and saved list, so only values are checked
        frames = own_done_frames(msg) if type(msg) is Done else None
        if frames is None or len(frames[1]) + 4 > self._send_limit:
            frames = self._encode(msg)  # which fails a Done too large for the broker
        if frames is None:
            return
        gathered = self._gathered
        if gathered is not None and threading.get_ident() == self._io_thread:
            if type(msg) is Done and header_only(frames) is not None:
                gathered.append(frames)
                return
            self._send_gathered()  # what was gathered goes first: the order is kept
        lock = self._results_lock  # _post_frames, without its call (a Done per job)
        lock.acquire()  # not `with`: acquire and release are a third of its cost
        try:
            if not self._closed:
                send_frames(self._results, to_wire(frames))
        except zmq.Again:
            log.warning("rank %d: result queue full, dropped %s", self.rank, msg.TAG)
        finally:
            lock.release()

    def _post_done_frames(self, frames: list[Any]) -> None:
        """:meth:`_post` for a Done the job shell packed itself (an inline run's, in
        plaintext or with its small scalars sealed): gathered while a batch is handled (the
        I/O thread's), else sent: on the I/O thread's own dealer from there (see
        :meth:`_post_done_frame`), else on the result channel. One too large for the
        broker goes to :meth:`_post` as its record, which fails it instead."""
        if len(frames[1]) + 4 > self._send_limit:  # (a one-scalar Done's frame never is)
            self._post_too_large(frames)
            return
        if threading.get_ident() == self._io_thread:
            gathered = self._gathered
            if gathered is not None:
                if header_only(frames) is not None:
                    gathered.append(frames)
                    return
                self._send_gathered()  # what was gathered goes first: the order is kept
            elif not self._closed:
                magic, header = frames
                try:
                    _raw_send(self.dealer, magic + header, _NOBLOCK)  # one frame (wire v4)
                    return
                except zmq.Again:  # no broker connected just now: the channel queues it
                    pass
        magic, header = frames  # send_frames of a header-only message, without its call
        lock = self._results_lock
        lock.acquire()  # not `with`: acquire and release are a third of its cost
        try:
            if not self._closed:
                _raw_send(self._results, magic + header, _NOBLOCK)  # one frame (wire v4)
        except zmq.Again:
            log.warning("rank %d: result queue full, dropped Done", self.rank)
        finally:
            lock.release()

    def _post_too_large(self, frames: list[Any]) -> None:
        """Instead of a Done the job shell packed (its values sealed already, in secure
        mode) that is over the broker's limit: its job's Failed, saying so."""
        done = decode(frames, unpickle=False)  # our own packing: for its job's names only
        size, limit = len(frames[1]) + 4, self._send_limit
        what = f"the result of job {getattr(done, 'job', '?')} on rank {self.rank}"
        error = too_large(what, size, limit, "the broker")
        log.warning("rank %d: %s", self.rank, error)
        failed = substitute(done, error, self.rank)
        if failed is not None:
            self._post_frames(encode(failed), "Failed")

    def _post_done_frame(self, frame: bytes) -> None:
        """:meth:`_post_done_frames` for a Done packed as its one frame (wire v4: the magic
        and the header; a plaintext inline run's, ``mpl.wire.done_pack.OneSpanDone``).

        On the I/O thread (an inline run's, all of them) it goes on that thread's own
        dealer, the connection its Exec came in on, rather than the result channel: the
        broker takes a Done from either (``Registry.worker``), and on the Exec's own TCP
        connection the Done carries the acknowledgement of the Exec and the broker's next
        Exec that of the Done, where a second connection has the kernel send a segment of
        its own for each (about one and a half more a rank per job at world 8, by
        ``/proc/net/snmp``); nor is the channel's lock taken. Only the I/O thread sends on
        its dealer. Dones of different jobs may so arrive in another order than they were
        sent (as those of different ranks do): each job's answer is gathered by its id. A
        dealer with no broker connected (it queues nothing) leaves the Done to the channel,
        which queues it."""
        if threading.get_ident() == self._io_thread:
            gathered = self._gathered
            if gathered is not None:
                gathered.append([frame[:4], frame[4:]])  # a batch takes headers
                return
            if not self._closed:
                try:
                    _raw_send(self.dealer, frame, _NOBLOCK)
                    return
                except zmq.Again:  # no broker connected just now: the channel queues it
                    pass
        lock = self._results_lock
        lock.acquire()  # not `with`: acquire and release are a third of its cost
        try:
            if not self._closed:
                _raw_send(self._results, frame, _NOBLOCK)
        except zmq.Again:
            log.warning("rank %d: result queue full, dropped Done", self.rank)
        finally:
            lock.release()

    def _post_frames(self, frames: list[Any], what: str) -> None:
        with self._results_lock:
            if self._closed:
                return
            try:
                send_frames(self._results, to_wire(frames))
            except zmq.Again:
                log.warning("rank %d: result queue full, dropped %s", self.rank, what)

    def _send_gathered(self) -> None:
        """Send the Dones gathered while handling a batch: two or more as one batch."""
        gathered = self._gathered
        if not gathered:
            return
        self._gathered = []
        for frames, carried in coalesce((done, True) for done in gathered):
            self._post_frames(frames, f"batch of {carried} Done" if carried > 1 else "Done")

    def _announce_channel(self) -> None:
        """Tell the broker which connection carries our results, without blocking the I/O
        thread: while the result socket's queue is full (results that piled up while the
        broker was away), the timers try again on every turn of the loop."""
        with self._results_lock:
            if self._closed:
                return
            try:
                frames = to_wire(encode(Channel(self.rank, self.incarnation)))
                self._results.send_multipart(frames, zmq.NOBLOCK, copy=False)
                self._channel_owed = False
            except zmq.Again:
                log.debug("rank %d: result queue full, the channel is announced later", self.rank)
