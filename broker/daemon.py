"""The broker's ZeroMQ shell: one ROUTER socket, one loop, no call that blocks longer
than a timer tick.

It takes one message at a time with a blocking receive bounded by the timer tick (a
message already queued costs no system call); when the timers are due, it first handles
everything queued, then runs them. Each message it decodes (never unpickling: payloads pass
through opaque), feeds to :class:`BrokerState`, and sends what the state asks for. What
the state only forwards goes out as the frames it came in, or as headers spliced from them
(``mpl.wire.hot``): an Exec to n ranks is never encoded n times; a job's answer is packed
in one call from the Done values the lean reader read.

What a wake-up's messages ask to send is queued and sent at its end (``mpl.broker.outbox``,
the send side), each peer's messages in order, and only then does the broker do its
accounting for them (the job ledger's starts, ends and spans, the log lines for refusals
and failed jobs): the workers and the driver run on while it finishes, and every count is
in place before the next wake-up reads a message. With jobs in flight, a run of Execs to
one worker or of JobResults to one driver goes as one batch (``mpl.wire.batch``), and a
batch that arrives is split and each message in it handled as if it had come alone (a Done
or an Exec of the hot path read and handed to the state in the batch's own loop). The
loop reads a one-part message of the hot path itself; any other, and a batch, is read by
the receive side past it (``mpl.broker.inbox``). The Exec of a job alone in flight, with
nothing queued before it, goes to its ranks at once, skipping the queue (nothing could
share a batch with it). The clock is read once per wake-up, for its messages and the
timers alike. A sender's Execs of one program differ in their job ids alone: each is read
by comparing it with that sender's last one read in full (``mpl.wire.exec_repeat``, a
reader per sender, bounded); a sealed one's boxes are cut in the same walk, in the loop
itself (its Exec as the rest).

A socket monitor reports closed TCP connections, mapped back to their peers by fd
(``mpl.broker.connections``): a killed worker is noticed in milliseconds rather than after 3
missed heartbeats.

In secure mode (``curve``) the ROUTER is a CURVE server: a :class:`Gatekeeper` admits only
the workers and drivers the broker's spec pins, and each message goes to the state with
the identity its connection authenticated as (``who``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from mpl.broker.connections import ConnectionWatch
from mpl.broker.inbox import KEPT_FRAME_BELOW, Inbox
from mpl.broker.ledger import JobLedger
from mpl.broker.outbox import Outbox
from mpl.broker.state import BrokerState, Send
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, SLICE_BELOW, encode, to_wire
from mpl.wire.control import HEARTBEAT_S, Bye
from mpl.wire.curve import BROKER_DOMAIN, Curve, broker_admits
from mpl.wire.done_repeat import RepeatDones
from mpl.wire.exec_repeat import RepeatExecs
from mpl.wire.guard import Guard
from mpl.wire.hot import DONE_FRAME_PREFIX, EXEC_PREFIX, DoneRead, read_done_header, read_hot_header
from mpl.wire.identity import USER_ID
from mpl.wire.jobs import Exec
from mpl.wire.limits import MAX_CONTAINERS
from mpl.wire.logs import RefusalLog
from mpl.wire.record import Record
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, SealedExecReaders
from mpl.wire.snapshot import SnapshotSlot
from mpl.wire.sockets import MAX_MESSAGE, configure, drain, recv_frames, recv_queued

if TYPE_CHECKING:  # imported where a secure broker starts one: asyncio comes with it
    from mpl.wire.zap import Gatekeeper

__all__ = ["Broker"]

# The compiled socket's own send and receive: the broker's loop calls them directly for
# what it sends and receives on every job (mpl.wire.sockets does the same per call)
_raw_recv: Any = zmq.backend.Socket.recv
_frame_get: Any = zmq.Frame.get  # a received frame's property: its User-Id (mpl.wire.identity)

log = logging.getLogger("mpl.broker")
_TICK_S = 0.05  # timers and disconnect events run this often; it also bounds a stop's wait
_TICK_MS = int(_TICK_S * 1000)
_BATCH = 256  # queued messages handled before the timers, at most
# messages handled per wake-up before what they ask for is sent, at most (and no more once
# that many sends wait): the sends of one wake-up are coalesced per peer (mpl.wire.batch),
# so a few more per wake-up mean fewer messages out, while the bound keeps an answer from
# waiting behind a long queue. 16 keeps the three processes working at once: with 64 each
# wake-up held a whole window of answers, and driver, broker and worker took turns (64 jobs
# in flight, 2 cores: about 1.2 cores busy and 9-10k jobs/s at 64; 1.5 cores and 11.5-11.9k
# at 16; 12 and 20 were no better than 16)
_WAKE = 16
_EXEC_FRAME_PREFIX = MAGIC_FRAME + EXEC_PREFIX
# the loop reads a Done of one frame shorter than SLICE_BELOW with no check of its length
assert SLICE_BELOW <= MAX_CONTAINERS


class Broker(Outbox, ConnectionWatch, Inbox):
    """A broker bound to ``listen`` (``tcp://127.0.0.1:0`` picks a free port).

    Run it with :meth:`serve_forever` (blocking) or :meth:`start` (a thread); stop it with
    :meth:`stop`, from any thread or a signal handler.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        listen: str = "tcp://127.0.0.1:5555",
        *,
        context: zmq.Context[Any] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        curve: Curve | None = None,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        self._own_context = context is None
        self.ctx: zmq.Context[Any] = context or zmq.Context()
        self.gatekeeper: Gatekeeper | None = None
        self.router = configure(self.ctx.socket(zmq.ROUTER), max_message=max_message)
        if curve is not None:
            # the ZAP handler runs before the socket binds: a CURVE server without one
            # would let in any client that knows the broker's public key
            from mpl.wire.zap import Gatekeeper

            self.gatekeeper = Gatekeeper(self.ctx, broker_admits(cluster))
            self.gatekeeper.start()
            curve.serve(self.router, BROKER_DOMAIN)
        self.secure = curve is not None
        self._world_size = cluster.world_size  # the most ranks a job can name
        self.router.bind(listen)
        self.address: str = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._watch_connections(self.address)  # closed TCP connections end their peers
        self.state = BrokerState(
            cluster,
            now=time.monotonic(),
            heartbeat_s=heartbeat_s,
            secure=self.secure,
            max_message=max_message,
        )
        self.ledger = JobLedger()  # job outcomes and durations, for metrics and the page
        self.snapshots = SnapshotSlot()  # copies of the state for the metrics thread
        self.refusals = RefusalLog(log)
        self.guard = Guard(log, self.state.counters)  # one bad message never stops the loop
        # what this wake-up's messages asked to send, with its frames, in order
        self._outbox: list[tuple[Send, list[Any]]] = []
        # what this wake-up leaves to account for once its sends are out, in the order it
        # happened: (ledger.received, msg, when) for an Exec, (_observe, action, logged) for
        # a JobResult or Refused the broker sends (so a job's start is noted before its end)
        self._accounts: list[tuple[Callable[[Any, Any], Any], Any, Any]] = []
        # batches received, refused (as bad messages) and sent: in the status, with the rest
        for counter in ("batches_received", "batches_refused", "batches_sent"):
            self.state.counters.setdefault(counter, 0)
        # each sender's last Exec read in full, to read its next by comparison (_exec_of)
        self._exec_readers: dict[bytes, RepeatExecs] = {}
        # each sender's last Done read in full, to read its next by comparison (_turn)
        self._done_readers: dict[bytes, RepeatDones] = {}
        self._sealed_execs = SealedExecReaders()  # each sender's last sealed Exec, likewise
        self._jobs = self.state.calls.jobs  # the jobs in flight (the state never replaces it)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Broker:
        """Serve on a background thread (the in-process simulator's mode)."""
        self._thread = threading.Thread(target=self.serve_forever, name="mpl-broker", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to finish; it exits within ``_TICK_S``."""
        self._stopping.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def serve_forever(self) -> None:
        log.info("broker %s serving %s", self.state.broker_id, self.address)
        self.router.setsockopt(zmq.RCVTIMEO, _TICK_MS)
        next_tick = 0.0
        try:
            while not self._stopping.is_set():
                next_tick = self._turn(next_tick)
            self._say_goodbye()
        finally:
            self.close()

    def _turn(self, next_tick: float) -> float:
        """Wake-ups until the timers are due: wait for a message (at most RCVTIMEO), handle
        it and, with jobs in flight, whatever else is queued already (up to _WAKE), and send
        what they ask for, coalesced per peer; again, until the timers are due or a receive
        finds nothing for RCVTIMEO. Then, if the timers are due, handle every message queued
        (up to _BATCH) and run them. Returns when the timers are next due.

        A blocking receive of a message already queued costs no system call; the receives
        after it do not block and end at the first that finds nothing. The queue is
        drained before the timers, so a worker whose heartbeat waits in it is never
        declared silent (after the broker was descheduled for a while, say). The loop
        over wake-ups is here, not in the caller: a call and a look at the stop flag fewer
        per message (each rank's Done is one), and the stop flag is seen at every tick.
        A message of one part (wire v4) from a peer already known (each rank's Done, most) is
        read and handed to the state here too, as :meth:`_route` would: no call and no
        list of its frames per message.
        """
        router: Any = self.router  # a test may stand something else in
        jobs = self._jobs
        monotonic = time.monotonic
        # recv_frames written out for the compiled socket (a test's stand-in gets the call)
        recv = _raw_recv if isinstance(router, zmq.backend.Socket) else None
        # what _route does with a message of one part from a peer whose fd is mapped,
        # written out below for the compiled socket: each rank's Done is one
        mapped = None if self.monitor is None else self._peer_fd
        secure, counters, done_read = self.secure, self.state.counters, self.state.dones.read
        done_readers, exec_readers = self._done_readers, self._exec_readers
        sealed_repeat, world = self._sealed_execs.repeat_frame, self._world_size
        while True:
            try:
                if recv is None:
                    frames = recv_frames(router)
                else:
                    # the routing id as bytes: no Frame for it (a ROUTER message always has
                    # a part after it; its source fd and User-Id ride on every part)
                    peer = recv(router, 0, True)
                    first = recv(router, 0, False)  # the magic and the header (wire v4)
                    frames = None
                    if first.more:  # buffer frames: the rest is there already
                        frames = [peer, first]
                        frame = first
                        while frame.more:
                            frame = recv(router, 0, False)
                            frames.append(frame)
            except zmq.Again:
                break
            # one clock read per wake-up: its messages arrived together, and the timers
            # wait at most one wake-up longer
            now = monotonic()
            if (
                frames is not None
                or (mapped is not None and peer not in mapped)
                or len(first) >= SLICE_BELOW  # a large header: viewed, not sliced (_route)
            ):
                self._route(frames or [peer, first], now)
            else:
                # _route of a message of one part (a hot Done, most), without the call,
                # the list of its frames and the checks of what the receive made them
                try:  # one message's failure stays that message's failure
                    # the connection's authenticated identity, read per message (never
                    # cached: a routing id may come back on another key's connection)
                    who = _frame_get(first, USER_ID) if secure else None
                    # the frame's bytes (copied once, kept by the frame), counted, then its
                    # header cut; a Done's read without read_hot_header's call and its
                    # magic's cut (shorter than SLICE_BELOW: short enough for the reader)
                    one = first.bytes
                    counters["bytes_routed"] += len(one)
                    read: DoneRead | Exec | None
                    raw: list[Any] | None = None  # a sealed repeat's frames
                    if one.startswith(DONE_FRAME_PREFIX):
                        # a repeat of this sender's last Done (most; in secure mode its
                        # value's box, sealed anew for every job, taken as it comes) by
                        # comparison, else read in full and perhaps kept to compare the
                        # next ones with
                        dones = done_readers.get(peer) or self._done_reader(peer)
                        read = dones.repeat(one)
                        if read is None:
                            data = one[4:]
                            read = read_done_header(data)
                            if read is not None:
                                dones.keep(one, read)
                        if read is not None:  # handed to the state here, checked there
                            actions = done_read(peer, read, now, who)
                            if actions:  # most Dones leave their job waiting on other ranks
                                self._perform(actions)
                            data = None  # (its header goes nowhere else)
                    elif one.startswith(_EXEC_FRAME_PREFIX):
                        # a repeat of this sender's last Exec (most) compared as the frame
                        # came (RepeatExecs.repeat_frame: what repeat reads, without the
                        # frame's cut and three calls), else _exec_of
                        execs = exec_readers.get(peer)
                        data, read = one[4:], None
                        if execs is not None and len(one) < KEPT_FRAME_BELOW:
                            job = execs.repeat_frame(one)
                            if job is not None:
                                read = execs.record(job)
                        if read is None:
                            read = self._exec_of(peer, data)
                    elif secure and one.startswith(SEALED_EXEC_MAGIC):
                        # a repeat of this sender's last sealed Exec (most secure jobs) read
                        # in one walk of the frame, as _handle reads it; else read there
                        data, read = one[4:], None
                        sealed = sealed_repeat(peer, one, world)
                        if sealed is not None:
                            read, raw = sealed
                    else:
                        data = one[4:]
                        read = read_hot_header(one[:4], data)
                except Exception as exc:
                    self._contain(peer, None, exc)
                else:
                    if data is not None:  # (a Done was handed to the state above)
                        if type(read) is Exec:  # _handle's Exec case, without its call
                            try:  # one message's failure stays that message's failure
                                self._accounts.append((self.ledger.received, read, now))
                                if raw is None:
                                    raw = [MAGIC_FRAME, data]
                                actions = self.state.exec_read(peer, read, now, raw, who)
                                if len(jobs) == 1 and not self._outbox:
                                    self._fan_out(actions)  # nothing it could be batched with
                                else:
                                    self._perform(actions)
                            except Exception as exc:
                                self._contain(peer, read, exc)
                        else:
                            self._handle(peer, [one[:4], data], now, who, batch_ok=True, read=read)
            # With one job or none in flight nothing queued could share a batch with what
            # this message asks to send: skip the receive that would find nothing (a
            # system call and a zmq.Again on the one-job-at-a-time path).
            if len(jobs) > 1:  # state.jobs_in_flight, without the property's call
                for frames in recv_queued(router, _WAKE - 1):
                    self._route(frames, now)
                    if len(self._outbox) >= _WAKE:  # batches in: answers go out before more
                        break
            if self._outbox or self._accounts:  # most Dones ask for nothing: no call
                self._flush()
            if now >= next_tick:
                break
        now = time.monotonic()
        if now < next_tick:
            return next_tick
        # most often nothing waits (the receive above ran out of time): no zmq.Again for it
        for frames in drain(self.router, _BATCH, look_first=True):
            self._route(frames)
        self._flush()
        now = time.monotonic()
        try:
            if self.monitor is not None:
                self._drain_monitor()
            self._perform(self.state.tick(now))
            self.snapshots.serve(self._snapshot)
        except Exception as exc:
            self._contain(None, None, exc)
        self._flush()
        return time.monotonic() + min(_TICK_S, self.state.heartbeat_s / 4)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unwatch()
        self.router.close()
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
        if self._own_context:
            self.ctx.term()

    # -- failures, the status, the goodbye ------------------------------------------------
    def _contain(self, peer: bytes | None, msg: Record | None, exc: Exception) -> None:
        """Count and log a failure, and answer the sender if it waits for an answer."""
        reply = self.guard.internal(peer.hex() if peer else "the timers", msg, exc)
        if reply is not None and peer is not None:
            self._flush()  # after what was queued for the peer before it
            with contextlib.suppress(Exception):
                self.router.send_multipart([peer, *to_wire(encode(reply))], zmq.NOBLOCK, copy=False)

    def _snapshot(self) -> dict[str, Any]:
        return {"status": self.state.status(time.monotonic()), "ledger": self.ledger.snapshot()}

    def _say_goodbye(self) -> None:
        bye: Record = Bye("broker shutting down")
        for peer in list(self.state.registry.by_peer) + list(self.state.drivers):
            with contextlib.suppress(zmq.ZMQError):
                self.router.send_multipart([peer, *to_wire(encode(bye))], zmq.NOBLOCK)
