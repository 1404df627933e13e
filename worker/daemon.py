"""The worker's ZeroMQ shell: an I/O thread on the broker's socket, a thread for peer moves.

* a DEALER to the broker: control, jobs, fetches (re-created if the broker goes silent),
  received by the I/O thread, which also runs the timers (hellos, heartbeats, silence);
* a PULL it binds for peer moves (its address goes to the broker's directory), received by
  the peer thread (``peer_intake.py``) straight into the mailbox the job threads wait on.

Every decision is the state machine's (``state.py``): this shell decodes, feeds it each
message as an event, and performs the actions it returns (sends, reconnects); the job shell
(``jobs.py``) performs the rest. How a message from the broker is read and dispatched is
``broker_messages.py``'s (a part of :class:`Worker`); its DEALERs to the broker, the watch
on their handshake and sending on them are ``broker_link.py``'s; the loop and its timers are
here. Jobs run on a pool of job threads, so heartbeats and
fetches keep flowing while a job computes; only a quick, purely local program whose last
run took under a millisecond runs on the I/O thread itself (no hand-off, see ``jobs.py``).
A batch of broker messages (``mpl.wire.batch``) is handled one message at a time, as if
each had come alone; the Dones of the jobs it ran inline meanwhile go back in batches.
Job threads send their answers on a second DEALER, the result channel (one socket behind a
lock, announced to the broker with ``Channel``: ``result_channel.py``), and their moves on
the peer links (``peers.py``): neither waits for the I/O thread.

In secure mode (``curve``) every socket runs CurveZMQ with keys from the worker's OWN copy
of the cluster spec: its DEALERs pin the broker's key, its peer links pin each rank's key,
and its data and SPU sockets admit only the spec's nodes (a :class:`Gatekeeper`). A move
whose ``src`` is not the rank its connection authenticated as is counted and dropped
(``peer_intake.py``). The same spec says per driver what its jobs may run here (a driver
listed ``code: kernels``: named kernels only, ``sealing.py``), and the file kernels keep
each driver to its own folder under the data root (``kernel_table.driver_root``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import socket as _socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from mpl.wire.codec import SLICE_BELOW, from_wire
from mpl.wire.control import HEARTBEAT_S, Bye, Heartbeat, WorkerHello
from mpl.wire.curve import Curve, peer_admits
from mpl.wire.exec_repeat import RepeatExecs
from mpl.wire.guard import Guard
from mpl.wire.incarnation import public_incarnation
from mpl.wire.logs import RefusalLog
from mpl.wire.remote import ErrorInfo
from mpl.wire.runtime_info import node_runtime_info
from mpl.wire.safe_values import WORKER, pickles_allowed
from mpl.wire.snapshot import SnapshotSlot
from mpl.wire.sockets import MAX_MESSAGE, announced_limit, recv_frames
from mpl.worker.broker_link import BrokerLink
from mpl.worker.broker_messages import BrokerMessages
from mpl.worker.code_policy import CODE_POLICIES, driver_code_policy
from mpl.worker.holding import held_moves, held_spu
from mpl.worker.jobs import DEFAULT_JOB_TIMEOUT_S, Jobs
from mpl.worker.kernel_table import DEFAULT_DRIVER_QUOTA, KernelTable, NodeBindings
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.metrics import rss_bytes
from mpl.worker.peer_intake import PeerIntake
from mpl.worker.peers import PeerLinks
from mpl.worker.result_channel import ResultChannel
from mpl.worker.session_runtime import SessionRuntimes
from mpl.worker.spu_kernels import SpuService
from mpl.worker.spu_link import SpuLinks
from mpl.worker.state import WorkerState
from mpl.worker.state_events import (
    Action,
    Beat,
    CloseAll,
    Joined,
    Reconnect,
    Send,
    Stop,
    Tick,
    Unanswered,
)
from mpl.worker.store import ObjectStore, SymbolDisk

if TYPE_CHECKING:  # secure mode's: imported where a secure worker builds them
    from mpl.wire.zap import Gatekeeper
    from mpl.worker.sealing import WorkerSeal

__all__ = ["Worker"]

log = logging.getLogger("mpl.worker")
_POLL_MS = 100  # the timers run at least this often while there is work about
# How late the timers may run while messages stream in. Each reset of the receive timeout
# costs about 8k instructions and a stream resets it once per slack; 25 ms (a fifth of the
# resets) made the 2p SPU matmul slower in two interleaved pairs (40-44 against 46-52 ms,
# floors 42-45), so the slack stays 5 ms.
_SLACK_MS = 5
_raw_set = zmq.backend.Socket.set  # the compiled option setter, as setsockopt is
_RCVTIMEO = int(zmq.RCVTIMEO)  # a plain int: no enum looked up per reset
_JOIN_S = 2.0
_raw_recv = zmq.backend.Socket.recv  # the compiled receive, as mpl.wire.sockets calls it
_raw_send = zmq.backend.Socket.send  # the compiled send (an inline run's Done, in _turn)
_NOBLOCK = int(zmq.NOBLOCK)


class Worker(BrokerMessages, ResultChannel, BrokerLink):
    """One rank's worker, connected to the broker at ``broker``.

    ``data_bind`` is where peers reach it (default ``tcp://<host>:0``, a free port);
    ``data_root`` holds values saved with ``persist=True``. Run it with
    :meth:`serve_forever` or :meth:`start`; stop it with :meth:`stop` from anywhere.
    """

    def __init__(
        self,
        broker: str,
        rank: int,
        *,
        context: zmq.Context[Any] | None = None,
        data_root: Path | None = None,
        host: str = "127.0.0.1",
        data_bind: str | None = None,
        spu_bind: str | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
        extensions: dict[str, Callable[[], Any]] | None = None,
        trusted: bool = False,
        curve: Curve | None = None,
        max_message: int = MAX_MESSAGE,
        code: str = "any",
        kernels: Sequence[str] = (),
        driver_quota: int = DEFAULT_DRIVER_QUOTA,
    ) -> None:
        if code not in CODE_POLICIES:
            raise ValueError(f"code policy must be one of {', '.join(CODE_POLICIES)}, got {code!r}")
        self.code = code
        # drivers this node's own spec holds to named kernels on this --code any worker
        kernels_drivers = driver_code_policy(curve.cluster if curve is not None else None, code)
        self.broker_url = broker
        self.rank = rank
        self.trusted = trusted  # this party's own choice: pickles may cross between parties
        self.curve = curve
        self._max_message = max_message
        # the largest frame this worker sends the broker: the least of its own limit and the
        # broker's (its Welcome's), so an answer over it fails instead of being dropped
        self._send_limit = max_message
        self._own_context = context is None
        self.ctx: zmq.Context[Any] = context or zmq.Context()
        self.gatekeeper: Gatekeeper | None = None
        if curve is not None:
            if curve.cluster is None or not curve.cluster.secure:
                raise ValueError("a secure worker needs its own cluster spec with keys")
            # running before the servers bind: a CURVE server without a ZAP handler would
            # let in anyone who knows this worker's public key
            from mpl.wire.zap import Gatekeeper

            self.gatekeeper = Gatekeeper(self.ctx, peer_admits(curve.cluster))
            self.gatekeeper.start()
        self.incarnation = secrets.token_hex(8)
        # secure mode: payloads to and from drivers are sealed end to end (worker/sealing.py),
        # Execs for this process start only (its public incarnation)
        self.seal: WorkerSeal | None = None
        if curve is not None:
            from mpl.wire.seal import Sealer
            from mpl.worker.sealing import WorkerSeal

            self.seal = WorkerSeal(
                Sealer.for_node(curve, rank),
                rank,
                trusted=trusted,
                code=code,
                incarnation=public_incarnation(self.incarnation),
                kernels_drivers=kernels_drivers,
            )
        self.mailbox = move_mailbox(held_moves(curve, lambda: self.state.world_size))
        self.intake = PeerIntake(
            self.ctx,
            data_bind or f"tcp://{host}:0",
            rank,
            self.mailbox,
            self._move_refused,
            curve=curve,
            trusted=trusted,
            code=code,
            max_message=max_message,
        )
        self.data_addr = self.intake.address
        # Results queue while the connection is (re)established rather than being dropped.
        self._results = self._broker_socket()
        self._watch_handshakes()  # secure mode: a refused key ends the worker at once
        self._results.connect(broker)
        self._results_lock = threading.Lock()
        self._channel_owed = False  # joined, but the Channel could not be queued yet
        self.dealer: zmq.Socket[Any] = self._new_dealer()
        disk = SymbolDisk(data_root) if data_root is not None else None
        # secure mode: a session reads the persisted values of the driver it is bound to
        self.store = ObjectStore(disk, self.seal.admission.owner if self.seal else None)
        self.spu_links = SpuLinks(
            self.ctx,
            spu_bind or f"tcp://{host}:0",
            rank,
            lambda: self.state.directory,
            curve=curve,
            max_message=max_message,
            job_stopped=lambda job: self.jobs.stopped(job),
            holding=held_spu(curve, lambda: self.state.world_size),
            start=False,  # its callbacks read self.state and self.jobs: started below
        )
        infos, owners = disk.hello_lists() if disk else ([], {})
        hello = WorkerHello(
            rank,
            self.incarnation,
            os.getpid(),
            _socket.gethostname(),
            self.data_addr,
            self.spu_links.address,
            infos,
            curve.keys.public if curve else "",
            owners,
        )
        self.state = WorkerState(hello, now=time.monotonic(), heartbeat_s=heartbeat_s)
        self.peers = PeerLinks(
            self.ctx,
            lambda: self.state.directory,
            safe=not pickles_allowed(WORKER, trusted=trusted),
            curve=curve,
            max_message=max_message,  # the peers' limit is taken for ours: set alike
        )
        # secure mode binds logical ops, and reads this node's runtime_info, by our own
        # spec, never by the broker's Welcome
        own = curve.cluster.to_dict() if curve is not None and curve.cluster else None
        self.bindings = NodeBindings(rank, curve.cluster if curve is not None else None)
        # each session's runtime_info for this node: checked at open, seen by kernels
        self.runtimes = SessionRuntimes(
            rank,
            lambda: node_runtime_info(own or self.state.cluster, rank),
            cluster=lambda: own or self.state.cluster,
        )
        kernel_table = KernelTable(  # secure mode: file kernels keep to their driver's folder
            self.bindings,
            kernels,
            data_root,
            self.runtimes.of,
            per_driver=curve is not None,
            quota=driver_quota,
        )
        services: dict[str, Callable[[], Any]] = {
            "spu": lambda: SpuService(
                self.spu_links,
                lambda: self.state.directory,
                lambda session: self.jobs.spu_failures(session),
                self.runtimes.spu_devices,
                data_root,
            ),
            "kernels": lambda: kernel_table,
            **(extensions or {}),
        }
        self.jobs = Jobs(
            self.state,
            self.store,
            self.mailbox,
            self.peers,
            self._post,
            # an inline run's Done goes out as frames it packed itself (secure mode: its
            # values sealed first, when they are small scalars)
            post_frames=self._post_done_frames,
            post_frame=self._post_done_frame,
            seal_scalars=self.seal.sealed_scalars if self.seal is not None else None,
            sealers=self.seal,
            extensions=services,
            job_timeout_s=job_timeout_s,
            spu=self.spu_links,
            trusted=trusted,
        )
        self.jobs.send_limit = max_message  # until the broker's Welcome says its own
        self.refused: ErrorInfo | None = None
        self.joined = threading.Event()
        self.protocol_errors = 0
        # Wakes the I/O thread when it rests (see _turn): a stop, a metrics reader.
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._resting = False
        self._woken = False  # a _wake() the timers have not served yet (any thread sets it)
        self.snapshots = SnapshotSlot(self._wake)  # copies of stats() for the metrics thread
        self.refusals = RefusalLog(log)
        self._faults: dict[str, int] = {}
        self.guard = Guard(log, self._faults)  # counts internal_errors; the loop goes on
        self._clock = 0.0  # time.monotonic() as the I/O thread's last turn ended
        # the RCVTIMEO last set, and on which dealer (a replaced one starts unset)
        self._rcvtimeo_on: zmq.Socket[Any] | None = None
        self._rcvtimeo_ms = -1
        # asked to stop (by any thread): a plain flag, which the loop reads on every turn
        # without a call (Event.is_set is a Python call per message)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._closed = False
        # While the I/O thread handles a batch of the broker's messages, the Dones it posts
        # (the jobs it runs inline) gather here and go out as one batch after it.
        self._io_thread = 0
        self._gathered: list[list[Any]] | None = None
        # the broker's Execs: a program's next job is read by comparison with its last one
        self._execs = RepeatExecs()
        self._sealed_repeat = self._execs.repeat_sealed_frame  # (secure mode's, per job)
        self._any_code = code == "any"  # sealed repeats run by job id (else: _on_broker)
        # only now: what arrives on the link reaches self.state and self.jobs, built above
        self.spu_links.start()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Worker:
        self._thread = threading.Thread(
            target=self.serve_forever, name=f"mpl-worker-{self.rank}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        """Wake the I/O thread if it rests, and have its timers run after its next message
        if it does not (any thread; a signal handler too): a metrics reader waits for them,
        which may be a heartbeat away while quick jobs stream in."""
        self._woken = True
        with contextlib.suppress(OSError):  # full (woken already) or closed (gone)
            os.write(self._wake_w, b"w")

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def serve_forever(self) -> None:
        log.info("rank %d: data on %s, joining %s", self.rank, self.data_addr, self.broker_url)
        self.intake.start()
        self._io_thread = threading.get_ident()
        try:
            next_timers = 0.0
            while not self._stopping:
                next_timers = self._turn(next_timers)
            self._send(Bye("worker shutting down"))
        finally:
            self._stopping = True
            self.intake.stop(_JOIN_S)  # its sockets close below, once its thread is out
            self.close()

    def _turn(self, next_timers: float) -> float:
        """One wake-up of the I/O thread: wait for a broker message (at most until the
        timers are due) and handle it; then run the timers if they are due. Returns when
        they are next due.

        A blocking receive of a message already queued costs no system call, where a poll
        round per message (the poll, then an event check per socket) costs several; the
        peer socket has its own thread (``peer_intake.py``), so this one waits on the
        broker's socket alone. Timers are checked after every message, so heartbeats go
        out while messages stream in, and each message is handled before the silence
        check that follows it, so a broker heard just now is never declared silent.

        An idle worker rests: once a wait timed out with no job, task, deferred move or
        owed channel about, it sleeps in :meth:`_rest` until the heartbeat is due, rather
        than waking every ``_POLL_MS`` (with 32 workers on 2 cores, every wake-up of every
        idle worker costs the busy ones). The first message ends the rest.
        """
        dealer = self.dealer
        frames: list[Any] | None = None
        one: bytes | None = None  # a message of one small frame (most): its bytes
        if self._resting:
            frames = self._rest(dealer, next_timers)
        else:
            # the clock as the last turn ended (a moment ago) rather than a read of it;
            # clamped by comparisons (min and max are calls)
            wait_ms = int((next_timers - self._clock) * 1000) + 1
            if wait_ms > _POLL_MS:
                wait_ms = _POLL_MS
            elif wait_ms < 0:
                wait_ms = 0
            # Reset the timeout only when it is off by more than the slack (a socket option
            # per message costs more than the receive): the timers may run up to _SLACK_MS
            # late.
            set_ms = self._rcvtimeo_ms if self._rcvtimeo_on is dealer else -1
            if not wait_ms <= set_ms <= wait_ms + _SLACK_MS:
                _raw_set(dealer, _RCVTIMEO, wait_ms)
                self._rcvtimeo_on, self._rcvtimeo_ms = dealer, wait_ms  # a new dealer: unset
            try:  # recv_frames, without its call (the dealer is a socket of ours)
                # A frame's fields read as attributes: zmq.Frame's Python half defines
                # __getattr__, whose hook these reads pass through, and yet they cost less
                # than calls of the compiled class's descriptors (a method-wrapper call each,
                # about 400 instructions more per message in all, by callgrind)
                frame = _raw_recv(dealer, 0, False)
                if frame.more:
                    frames = [frame]
                    while frame.more:  # the rest of the message is there: never blocks
                        frame = _raw_recv(dealer, 0, False)
                        frames.append(frame)
                elif len(frame) < SLICE_BELOW:
                    one = frame.bytes  # copied once (from_wire, written out)
                else:
                    frames = [frame]
            except zmq.Again:
                pass
        if one is not None:
            self._resting = False
            # a program's next Exec is recognised in the frame as received (secure mode:
            # by its header and box, under --code any; kernels: _on_frames reads it)
            if self.seal is None:
                job = self._execs.repeat_frame(one)
                if job is None:
                    self._on_frames([one[:4], one[4:]])  # the magic and the header, cut in two
                elif self.runtimes.refused_sessions:
                    self._on_repeat(job)
                else:  # _on_repeat's common case, one call (Jobs.run_repeat) and its send
                    try:
                        done = self.jobs.run_repeat(self._execs.last, job)  # type: ignore[arg-type]
                    except Exception as exc:
                        self._repeat_failed(job, exc)
                    else:
                        if done is None:  # not to run inline, nothing done: a record's path
                            self._on_repeat(job)
                        elif done:  # _post_done_frame's send, on this thread's dealer
                            try:
                                _raw_send(dealer, done, _NOBLOCK)
                            except zmq.Again:  # no broker connected: the channel queues it
                                self._post_done_frame(done)
            elif (got := self._sealed_repeat(one) if self._any_code else None) is not None:
                self._on_sealed_repeat(got[0], self.rank, got[1])
            else:
                self._on_frames([one[:4], one[4:]])
        elif frames is not None:
            self._resting = False
            first = frames[0]  # the magic and the header (wire v4): cut in two
            if len(frames) == 1 and type(first) is zmq.Frame and len(first) < SLICE_BELOW:
                one = first.bytes  # copied once, then sliced (from_wire, written out)
                self._on_frames([one[:4], one[4:]])
            else:
                self._on_frames(from_wire(frames))
        if self.intake.deferred:
            self.intake.put_deferred()
        now = self._clock = time.monotonic()
        if now < next_timers and not self._woken:
            if frames is None and one is None:  # a wait timed out: rest from the next turn
                quiet = self._resting = self._quiet()  # if all is quiet
                if not quiet:  # work about (a pooled job, say): timers every _POLL_MS
                    return min(next_timers, now + _POLL_MS / 1000)
            elif next_timers > now + _POLL_MS / 1000:  # set while quiet: is it still?
                # A message may have brought work the timers look after (a pooled job's
                # progress, a task, a hello after a Bye): they come back to _POLL_MS at
                # once, not after a timeout that a stream of messages never lets happen.
                # Between the quick jobs of a stream none of these holds (a few loads).
                state = self.state
                if state.jobs or state.queued or self._channel_owed or not state.joined:
                    return now + _POLL_MS / 1000
            return next_timers
        try:  # timers are guarded like messages: a failing stats() must not stop us
            self._woken = False  # first: a wake from now on is served by the next run
            if self._handshakes is not None:  # secure mode (no call otherwise)
                self._drain_handshakes()
            self._perform(self.jobs.handle(Tick()))
            if self._channel_owed:
                self._announce_channel()
            self.snapshots.serve(self.stats)
            self.jobs.report_progress()
        except Exception as exc:
            self.guard.internal("the timers", None, exc)
        # With nothing about that the timers look after more often (_quiet), they are next
        # due when the state says (a heartbeat away at most); else in _POLL_MS at most.
        # Between the quick jobs of a stream all is quiet too: timers every _POLL_MS there
        # cost a reset of the receive timeout every _SLACK_MS (see _turn), a few thousand
        # instructions per job at a job every few ms. Rest (sleep until they are due) once a
        # wait for the broker timed out so.
        quiet = self._quiet()
        if frames is None and one is None:
            self._resting = quiet
        now = self._clock = time.monotonic()
        cap = self.state.heartbeat_s if quiet else _POLL_MS / 1000
        return now + min(cap, max(0.0, self.state.next_due() - now))

    def _quiet(self) -> bool:
        """Nothing that the timers look after more often than the heartbeat: joined (no
        hellos, no handshake to watch), no job or task of this worker in flight (no
        progress to report), no channel to announce, no deferred moves."""
        return (
            self.state.joined
            and not self.state.jobs
            and not self.state.queued
            and not self._channel_owed
            and not self.intake.deferred
        )

    def _rest(self, dealer: zmq.Socket[Any], next_timers: float) -> list[Any] | None:
        """An idle worker's wait: one poll on the broker's socket and the wake pipe until
        the timers are due (a heartbeat away), instead of a timed receive every _POLL_MS.
        A wake-up serves a metrics reader; a stop ends the loop's turn."""
        wait_ms = max(0, int((next_timers - time.monotonic()) * 1000) + 1)
        watched: Any = [(dealer, zmq.POLLIN), (self._wake_r, zmq.POLLIN)]  # a socket, an fd
        frames: list[Any] | None = None
        for item, _ in zmq.zmq_poll(watched, wait_ms):
            if item is dealer:
                with contextlib.suppress(zmq.Again):
                    frames = recv_frames(dealer, zmq.NOBLOCK)
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 64):
                        pass
                self._woken = False  # served here
                try:
                    self.snapshots.serve(self.stats)
                except Exception as exc:
                    self.guard.internal("the timers", None, exc)
        return frames

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.jobs.close_all("the worker is shutting down")
        self.peers.close()
        self.spu_links.close()
        with self._results_lock:
            self._close_handshakes()
            self._results.close()
        self.dealer.close()
        self.intake.close()
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
        wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
        os.close(wake_r)  # a late stop() writes to -1 (refused), never to a reused number
        os.close(wake_w)
        if self._own_context:
            self.ctx.term()

    def stats(self) -> dict[str, int]:
        return {
            **self.jobs.stats(),
            "bytes_in": self.intake.bytes_in,
            "protocol_errors": (
                self.protocol_errors
                + self.intake.errors
                + self.spu_links.protocol_errors
                + self.state.bad_heartbeats
            ),
            "rss_bytes": rss_bytes(),
            "internal_errors": (
                self._faults["internal_errors"] + self.intake.faults["internal_errors"]
            ),
            **self.bindings.stats(),
        }

    # -- messages -------------------------------------------------------------------------
    def _move_refused(self, event: Any) -> None:
        """The peer thread refused a move (``--code kernels``): its job fails."""
        self.jobs.report(event)

    def _perform(self, actions: list[Action]) -> None:
        """Carry out what the state machine left to the I/O shell."""
        for action in actions:
            if isinstance(action, Send):
                msg = action.msg
                if isinstance(msg, WorkerHello) and self.store.disk is not None:
                    # the names persisted now, not at start: a restarted broker learns them
                    # (and whose each is, from the files)
                    infos, owners = self.store.disk.hello_lists()
                    msg = dataclasses.replace(msg, symbols=infos, owners=owners)
                self._send(msg)
            elif isinstance(action, Beat):
                self._send(Heartbeat(self.stats(), rank=self.rank))
            elif isinstance(action, Reconnect):
                log.warning("rank %d: reconnecting to the broker: %s", self.rank, action.reason)
                self.dealer.close(linger=0)
                self.dealer = self._new_dealer()
            elif isinstance(action, Unanswered):
                log.warning("rank %d: %s", self.rank, self._unanswered(action.seconds))
            elif isinstance(action, CloseAll):
                self.jobs.close_all(action.reason)
                self.runtimes.close_all()  # their runtime_info too: it held the budget
                if self.seal is not None:  # (not through its inbound: no SessionClosed)
                    self.seal.all_closed()
            elif isinstance(action, Joined):
                log.info("rank %d: joined broker %s", self.rank, action.broker_id)
                self.bindings.welcomed(self.state.cluster)
                broker_limit = announced_limit(self.state.broker_max_message)
                self._send_limit = self.jobs.send_limit = min(self._max_message, broker_limit)
                self._channel_owed = True  # the broker learns our result channel anew
                self._announce_channel()
                self.joined.set()
            elif isinstance(action, Stop):
                self.refused = action.error
                log.error("rank %d: refused by the broker: %s", self.rank, action.error.message)
                self._stopping = True
