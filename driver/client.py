"""The low-level driver client: requests to the broker, each with a deadline.

Every calling thread gets its own DEALER socket and waits for its answer on it, so a call
costs one round trip and no hand-off between threads. A :class:`~mpl.driver.watch.BrokerWatch`
heartbeats the broker for the client's sessions and tells waiting calls at once when the
broker is silent, restarted, or refuses this driver's key.

In secure mode (``curve``) every socket is a CURVE client pinned to the broker's key.

Who the client is: in secure mode, the name its key is pinned to in the cluster spec; in
plaintext mode, the ``driver`` name it declares on every socket's routing id
(:mod:`mpl.wire.routing`), by default a random one, so each client is a driver of its own.
Sessions belong to that identity. Job ids are random, so nobody can forge traffic for a job
before it exists.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import zmq

from mpl.driver.inflight import JobPump, Pending
from mpl.driver.job_future import JobFuture
from mpl.driver.job_progress import ProgressBoard
from mpl.driver.watch import BrokerWatch
from mpl.wire.batch import is_batch, split_batch
from mpl.wire.codec import decode, encode
from mpl.wire.control import HEARTBEAT_S, Bye, Refused
from mpl.wire.curve import Curve
from mpl.wire.data import Fetch
from mpl.wire.errors import MplError, MplTimeoutError, ProtocolError, SessionError
from mpl.wire.exec_pack import delete_frames, exec_frames
from mpl.wire.graph import Graph
from mpl.wire.jobs import Cancel, Exec, JobResult, Program
from mpl.wire.progress import Progress
from mpl.wire.record import Record
from mpl.wire.remote import from_info
from mpl.wire.result_read import read_answer
from mpl.wire.routing import check_driver_name, driver_routing_id
from mpl.wire.safe_values import WORKER, pickles_allowed
from mpl.wire.sessions import (
    CloseNamed,
    CloseSession,
    DeleteSymbol,
    ListRequest,
    LoadSymbol,
    OpenSession,
    Reply,
    SaveSymbol,
    SessionOpened,
    StatusRequest,
    SymbolInfo,
)
from mpl.wire.sockets import configure, recv_frames, send_frames

if TYPE_CHECKING:
    from mpl.driver.sealing import DriverSeal

__all__ = ["INPROC_CONTEXTS", "Client"]

# inproc:// endpoints only exist inside one ZeroMQ context: in-process clusters register
# theirs here, so a Client (or mp.connect) given such an address can reach it.
INPROC_CONTEXTS: dict[str, zmq.Context[Any]] = {}

log = logging.getLogger("mpl.driver")
_SLICE_MS = 100  # waits wake this often to notice a lost broker
_REPORT_GRACE_S = 1.0


# Forks of this process so far, as seen by the process itself: a child's count differs from
# its parent's, so a forked child notices without a getpid system call per job.
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class _JobIds:
    """Unguessable job ids, drawn from the OS's CSPRNG a batch at a time: one ``getrandom``
    call per ``_BATCH`` jobs instead of one per job. Safe to share between threads; a
    forked child draws its own batch (it must never repeat its parent's ids)."""

    _BATCH = 256
    _BYTES = 12

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0
        self._fork = -1

    def next(self) -> str:
        with self._lock:
            if self._at >= len(self._pool) or self._fork != _forks[0]:
                self._pool, self._at = os.urandom(self._BYTES * self._BATCH), 0
                self._fork = _forks[0]
            at = self._at
            self._at = at + self._BYTES
            return self._pool[at : at + self._BYTES].hex()


class _ThreadSocket:
    """One thread's DEALER; closed when the thread's locals are collected or the client closes."""

    def __init__(self, client: Client) -> None:
        self.sock = configure(client.ctx.socket(zmq.DEALER), linger_ms=0)
        if client.curve is not None:
            client.curve.dial(self.sock, client.curve.broker)
        self.sock.setsockopt(zmq.RCVTIMEO, _SLICE_MS)  # a blocking recv, woken every slice
        # a send blocks only while the queue to a broker long away is full: not forever
        self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(client.timeout * 1000)))
        self.sock.setsockopt(zmq.ROUTING_ID, driver_routing_id(client.driver))
        self.sock.connect(client.address)
        self._client = client
        with client._sockets_lock:
            client._sockets.add(self)

    def close(self) -> None:
        with self._client._sockets_lock:
            self._client._sockets.discard(self)
        if not self.sock.closed:
            self.sock.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown nothing is left to clean
            self.close()


class Client:
    """A connection to the broker at ``address``; safe to share between threads.

    ``timeout`` bounds control requests (sessions, fetches, names, status) and
    ``job_timeout`` bounds jobs; both can be overridden per call. ``driver`` is the name
    this client goes by in plaintext mode (default: a random one of its own).
    """

    def __init__(
        self,
        address: str,
        *,
        context: zmq.Context[Any] | None = None,
        timeout: float = 30.0,
        job_timeout: float = 600.0,
        heartbeat_s: float = HEARTBEAT_S,
        trusted: bool = False,
        curve: Curve | None = None,
        driver: str | None = None,
    ) -> None:
        self.address = address
        self.curve = curve
        self.trusted = trusted  # sets self.safe too: how answers are decoded
        # Secure mode seals every payload for its one worker (mpl.driver.sealing); imported
        # only then, so a plaintext driver does not load the cryptography package.
        self.seal: DriverSeal | None = None
        if curve is not None:
            from mpl.driver.sealing import driver_seal

            self.seal = driver_seal(curve, trusted)
        self.timeout = timeout
        self.job_timeout = job_timeout
        self.heartbeat_s = heartbeat_s
        self.client_id = secrets.token_hex(4)
        self.driver = check_driver_name(driver) if driver is not None else f"d{self.client_id}"
        if context is None and address.startswith("inproc://"):
            context = INPROC_CONTEXTS.get(address)
            if context is None:
                raise MplError(
                    f"{address} is an in-process address, and no simulator here serves it"
                )
        self._own_context = context is None
        self.ctx: zmq.Context[Any] = context or zmq.Context()
        self._local = threading.local()
        self._sockets: set[_ThreadSocket] = set()
        self._sockets_lock = threading.Lock()
        self._reqs = itertools.count(1)
        self._job_ids = _JobIds()
        self._programs: set[str] = set()
        self.sessions: set[str] = set()
        self.progress = ProgressBoard()  # jobs in flight: where their ranks are
        self.broker_id = ""
        self._closed = False
        self._pump: JobPump | None = None  # started by the first submit_async
        self._pump_lock = threading.Lock()
        self.watch = BrokerWatch(
            self.ctx,
            address,
            self.driver,
            self.sessions,
            heartbeat_s=heartbeat_s,
            curve=curve,
            broker_id=lambda: self.broker_id,
            on_restart=self._programs.clear,  # a new broker knows none of our programs
        )

    @property
    def trusted(self) -> bool:
        """Whether this driver's own spec says trusted: only then may results carry pickles."""
        return self._trusted

    @trusted.setter
    def trusted(self, value: bool) -> None:
        self._trusted = value
        # Results come from other parties: pickled ones load only if this driver's own spec
        # says trusted (never because the broker says so). Worked out here, not per answer.
        self.safe = not pickles_allowed(WORKER, trusted=value)  # decode answers safely?

    # -- sessions -------------------------------------------------------------------------
    def open_session(
        self,
        name: str = "",
        *,
        lease_s: float = 60.0,
        share_with: list[str] | None = None,
        cluster: dict[str, Any] | None = None,
    ) -> SessionOpened:
        """Open a session, or attach to the named one.

        ``share_with`` names the drivers (besides this one) that may attach to the session
        and act in it; only the session's owner may set it (a list replaces the previous one).
        Raises ``SessionAccessError`` when the named session belongs to another driver.
        ``cluster`` (a spec's dict form) gives the session its own devices over named nodes
        of the broker's cluster; the broker refuses it with ``ClusterSpecError``.
        """
        req = next(self._reqs)
        share = None if share_with is None else [check_driver_name(n) for n in share_with]
        opened = self._call(
            OpenSession(req, name, lease_s, self.client_id, share, cluster),
            lambda m: isinstance(m, (SessionOpened, Reply)) and m.req == req,
            self.timeout,
            "opening a session",
        )
        if isinstance(opened, Reply):
            raise (
                from_info(opened.error)
                if opened.error
                else ProtocolError("the broker answered an open with something else")
            )
        assert isinstance(opened, SessionOpened)
        if opened.broker_id != self.broker_id:
            self.broker_id = opened.broker_id
            self._programs.clear()
        self.sessions.add(opened.session)
        return opened

    def close_session(self, session: str) -> None:
        self.sessions.discard(session)
        self._send(CloseSession(session, self.client_id))

    # -- jobs -----------------------------------------------------------------------------
    def submit(
        self,
        session: str,
        graph: Graph,
        bindings: dict[int, list[Any]],
        *,
        inline: tuple[int, ...] = (),
        timeout: float | None = None,
    ) -> JobResult:
        """Run ``graph`` as one job and wait for its result; raises the job's error.

        Workers give up waiting for peer data after ``timeout`` seconds and report it; the
        driver waits a little longer (``_REPORT_GRACE_S``) so that report, which says which
        rank waited for what, arrives before the driver's own MplTimeoutError would.
        """
        msg, limit, deadline = self._exec(session, graph, bindings, inline, timeout)
        job = msg.job
        seal = self.seal
        if seal is not None:
            msg = seal.exec(msg)
        for attempt in range(2):
            if attempt or graph.digest not in self._programs:
                program = seal.program(graph) if seal else Program(graph.digest, graph)
                self._send(program)
                self._programs.add(graph.digest)
            try:
                result = self._job_call(msg, deadline, limit)
            except MplTimeoutError:
                self.progress.end(job, False)
                self._send(Cancel(session, job, f"the driver stopped waiting after {limit:g} s"))
                raise
            if not result.missing_program:
                if result.error is not None:
                    if seal is not None:  # a worker that forgot our stream: a new one
                        seal.refused(result.error)
                    raise from_info(result.error)
                return seal.result(session, result) if seal else result
        raise ProtocolError(f"the broker keeps losing program {graph.digest}")

    def submit_async(
        self,
        session: str,
        graph: Graph,
        bindings: dict[int, list[Any]],
        *,
        finish: Callable[[JobResult], Any] = lambda result: result,
        keep: Any = None,
        inline: tuple[int, ...] = (),
        timeout: float | None = None,
    ) -> Future[Any]:
        """Start ``graph`` as one job and return at once; the future holds ``finish(result)``.

        ``finish`` runs on the client's pump thread when the result arrives; ``keep`` (the
        job's input Values) stays referenced until then, so their deletes cannot overtake the
        job. The future fails with the job's error, with ``MplTimeoutError`` at its deadline,
        or with ``MplError`` if the client closes first.
        """
        msg, limit, deadline = self._exec(session, graph, bindings, inline, timeout)
        if self.seal is not None:
            msg = self.seal.exec(msg)
        future = JobFuture()  # RUNNING already: jobs are not taken back once handed over
        self.progress.begin(msg.job, mine=False)  # ended when its JobResult arrives
        pump = self._pump  # (not `or`: a JobPump's truth is its length)
        if pump is None:
            pump = self._job_pump()
        pump.put(Pending(msg, graph, deadline, limit, future, finish, keep))
        return future

    def abandon_jobs(self, reason: str) -> None:
        """Fail every job still in flight from ``submit_async`` with ``MplError(reason)``."""
        with self._pump_lock:
            pump, self._pump = self._pump, None
        if pump is not None:
            pump.close(reason)

    def _job_pump(self) -> JobPump:
        with self._pump_lock:
            if self._closed:
                raise MplError("the client is closed")
            if self._pump is None:
                self._pump = JobPump(self)
            return self._pump

    def _exec(
        self,
        session: str,
        graph: Graph,
        bindings: dict[int, list[Any]],
        inline: tuple[int, ...],
        timeout: float | None,
    ) -> tuple[Exec, float, float]:
        """The Exec for one job, its time limit, and the driver's deadline for its answer
        (the caller begins the job on the progress board)."""
        limit = self.job_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit + _REPORT_GRACE_S
        job = self._job_ids.next()  # unguessable: no one can prepare traffic for it
        ranks = graph.ranks
        for rank in bindings:
            if rank not in ranks:
                ranks = tuple(sorted({*ranks, *bindings}))
                break
        # Exec(...) filled in directly: a record this driver builds from its own parts per
        # job, so it skips the generated __init__ and the guarded __setattr__ per field (the
        # broker checks every field it receives)
        msg = object.__new__(Exec)
        msg.__dict__.update(
            session=session,
            job=job,
            digest=graph.digest,
            ranks=ranks,
            bindings=bindings,
            inline=inline,
            timeout_s=limit,
        )
        return msg, limit, deadline

    # -- data and names -------------------------------------------------------------------
    def fetch(self, session: str, rank: int, uri: str, *, timeout: float | None = None) -> Any:
        req = next(self._reqs)
        if self.seal is None:
            return self._reply(Fetch(session, req, rank, uri), req, timeout, f"fetching {uri}")
        reply_to, ticket = self.seal.fetch_ticket()
        fetch = Fetch(session, req, rank, uri, reply_to, ticket)
        value = self._reply(fetch, req, timeout, f"fetching {uri}")
        return self.seal.fetched(session, rank, uri, ticket, value)

    def delete(self, session: str, uris: dict[int, list[str]]) -> None:
        """Free values on the workers; no answer, but ordered after this thread's jobs."""
        if not any(uris.values()):
            return
        try:  # the frames of Delete(session, uris), packed without building the record
            send_frames(self._socket(), delete_frames(session, uris), 0)  # at most SNDTIMEO
        except zmq.Again:
            log.warning("the broker at %s takes no messages: dropped a delete", self.address)

    def save_symbol(
        self, session: str, uri: str, info: SymbolInfo, *, timeout: float | None = None
    ) -> None:
        req = next(self._reqs)
        self._reply(SaveSymbol(session, req, uri, info), req, timeout, f"saving {info.name!r}")

    def load_symbol(
        self,
        session: str,
        name: str,
        *,
        parties: tuple[int, ...] = (),
        timeout: float | None = None,
    ) -> SymbolInfo:
        req = next(self._reqs)
        load = LoadSymbol(session, req, name, tuple(parties))
        info = self._reply(load, req, timeout, f"loading {name!r}")
        if not isinstance(info, SymbolInfo):
            raise ProtocolError("the broker answered a load with something else")
        return info

    def delete_symbol(
        self,
        session: str,
        name: str,
        *,
        parties: tuple[int, ...] = (),
        timeout: float | None = None,
    ) -> None:
        req = next(self._reqs)
        unsave = DeleteSymbol(session, req, name, tuple(parties))
        self._reply(unsave, req, timeout, f"deleting {name!r}")

    def listing(
        self, what: str, session: str = "", *, timeout: float | None = None
    ) -> dict[str, Any] | list[Any]:
        """What the broker lets this driver see: ``sessions``, ``symbols`` or ``programs``."""
        req = next(self._reqs)
        value = self._reply(ListRequest(req, what, session), req, timeout, f"listing {what}")
        if not isinstance(value, (dict, list)):
            raise ProtocolError("the broker answered a listing with something else")
        return value

    def close_named(self, name: str, *, timeout: float | None = None) -> None:
        """Close the session called ``name`` (its owner only) for every attached client."""
        req = next(self._reqs)
        self._reply(CloseNamed(req, name), req, timeout, f"closing session {name!r}")

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        req = next(self._reqs)
        value = self._reply(StatusRequest(req), req, timeout, "asking for status")
        if not isinstance(value, dict):
            raise ProtocolError("status reply is not a mapping")
        return value

    def close(self) -> None:
        """Stop heartbeating and close every socket (LINGER is short: never hangs)."""
        if self._closed:
            return
        self.abandon_jobs("the client was closed while the job was in flight")
        self._closed = True
        self.watch.close()
        with self._sockets_lock:
            sockets = list(self._sockets)
        for s in sockets:
            s.close()
        if self._own_context:
            self.ctx.term()

    # -- plumbing -------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket[Any]:
        if self._closed:
            raise MplError("the client is closed")
        holder: _ThreadSocket | None = getattr(self._local, "socket", None)
        if holder is None or holder.sock.closed:
            holder = self._local.socket = _ThreadSocket(self)
        return holder.sock

    def _drop_thread_socket(self) -> None:
        """Close the calling thread's DEALER (a thread about to end calls it)."""
        holder: _ThreadSocket | None = getattr(self._local, "socket", None)
        if holder is not None:
            self._local.socket = None
            holder.close()

    def _send(self, msg: Record) -> None:
        """Send without an answer to wait for; dropped (and logged) if the queue to the
        broker stays full for ``timeout``: a delete or close is then left to the session's
        end or lease, a program is sent again when the broker asks for it."""
        try:
            send_frames(self._socket(), encode(msg), 0)  # blocks at most SNDTIMEO
        except zmq.Again:
            log.warning("the broker at %s takes no messages: dropped a %s", self.address, msg.TAG)

    def _reply(self, msg: Record, req: int, timeout: float | None, what: str) -> Any:
        reply = self._call(msg, lambda m: isinstance(m, Reply) and m.req == req, timeout, what)
        assert isinstance(reply, Reply)
        if reply.error is not None:
            raise from_info(reply.error)
        return reply.value

    def _call(
        self, msg: Record, match: Callable[[Record], bool], timeout: float | None, what: str
    ) -> Record:
        """Send ``msg`` and wait on this thread's socket for the answer ``match`` accepts."""
        limit = self.timeout if timeout is None else max(0.0, timeout)
        sock = self._socket()
        try:
            send_frames(sock, encode(msg), 0)  # blocks at most SNDTIMEO (jobs: _job_call)
        except zmq.Again:
            raise MplTimeoutError(
                f"{what}: the broker at {self.address} took no message for {self.timeout:g} s "
                "(the queue to it is full)"
            ) from None
        deadline = time.monotonic() + limit
        short = False  # RCVTIMEO lowered for the last slice before the deadline
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MplTimeoutError(
                        f"{what}: no answer from the broker at {self.address} within {limit:g} s"
                    )
                trouble = self.watch.trouble(getattr(msg, "session", None), what)
                if trouble is not None:
                    raise trouble
                if left * 1000 < _SLICE_MS:
                    sock.setsockopt(zmq.RCVTIMEO, int(left * 1000) + 1)
                    short = True
                try:
                    frames = recv_frames(sock)
                except zmq.Again:
                    self.progress.tick()
                    continue
                answer = self._answers(frames, match)
                if answer is not None:
                    return answer
        finally:
            if short:
                sock.setsockopt(zmq.RCVTIMEO, _SLICE_MS)

    def _job_call(self, msg: Exec, deadline: float, limit: float) -> JobResult:
        """``_call`` for a job: send its Exec, wait on this thread's socket for its JobResult.

        Only the packing is done before the send; the progress board, the watch's verdicts
        and the answer's reading come after it, while the broker and workers run the job.
        A JobResult for this job is read on a path of its own; anything else (a batch,
        another answer) goes through ``_answers`` as in ``_call``.
        """
        sock = self._socket()
        job = msg.job
        try:
            send_frames(sock, exec_frames(msg), 0)  # blocks at most SNDTIMEO
        except zmq.Again:
            raise MplTimeoutError(
                f"job {job}: the broker at {self.address} took no message for "
                f"{self.timeout:g} s (the queue to it is full)"
            ) from None
        self.progress.begin(job)  # ended when its JobResult arrives
        watch = self.watch
        short = False  # RCVTIMEO lowered for the last slice before the deadline
        try:
            while True:
                if watch.refused is not None or watch.silence is not None or watch.lost:
                    trouble = watch.trouble(msg.session, f"job {job}")
                    if trouble is not None:
                        raise trouble
                try:
                    frames = recv_frames(sock)
                except zmq.Again:
                    self.progress.tick()
                else:
                    mine = None if is_batch(frames) else self._job_answer(frames, job)
                    if mine is not None:
                        return mine
                    other = self._answers(frames, lambda m: type(m) is JobResult and m.job == job)
                    if other is not None:
                        assert isinstance(other, JobResult)
                        return other
                # a slice passed, or an answer to something else came: the deadline is near?
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MplTimeoutError(
                        f"job {job}: no answer from the broker at {self.address} within {limit:g} s"
                    )
                if left * 1000 < _SLICE_MS:
                    sock.setsockopt(zmq.RCVTIMEO, int(left * 1000) + 1)
                    short = True
        finally:
            if short:
                sock.setsockopt(zmq.RCVTIMEO, _SLICE_MS)

    def _job_answer(self, frames: list[Any], job: str) -> JobResult | None:
        """The JobResult of ``job`` if ``frames`` is one (ended on the progress board);
        None for anything else, which the caller reads the general way."""
        try:
            answer = read_answer(frames, safe=self.safe)
        except ProtocolError:
            return None  # _answers reads it again, and says why it is refused
        if type(answer) is not JobResult or answer.job != job:
            return None
        if not answer.missing_program:
            self.progress.end(job, answer.error is None)
        return answer

    def _answers(self, frames: list[Any], match: Callable[[Record], bool]) -> Record | None:
        """:meth:`_answer` for one ZeroMQ message, which may be a batch of answers
        (``mpl.wire.batch``): each is read as if it had come alone, in order."""
        if not is_batch(frames):
            return self._answer(frames, match)
        try:
            inner = split_batch(frames)
        except ProtocolError as exc:
            log.warning("bad message from the broker: %s", exc)
            return None
        found: Record | None = None
        for one in inner:
            answer = self._answer(one, match)
            if found is None:
                found = answer
        return found

    def _answer(self, frames: list[Any], match: Callable[[Record], bool]) -> Record | None:
        """The awaited answer among what arrived, or None for a stale message."""
        try:
            answer = read_answer(frames, safe=self.safe)
        except ProtocolError as exc:
            self._refuse_answer(frames, match, exc)
            log.warning("bad message from the broker: %s", exc)
            return None
        if isinstance(answer, JobResult) and not answer.missing_program:
            self.progress.end(answer.job, answer.error is None)
        if match(answer):
            return answer
        if isinstance(answer, Progress):
            self.progress.update(answer)
            return None
        if isinstance(answer, Refused):
            raise from_info(answer.error)
        if isinstance(answer, Bye):
            raise SessionError(f"the broker at {self.address} shut down")
        return None  # a late answer to a call this thread gave up on

    @staticmethod
    def _refuse_answer(
        frames: list[Any], match: Callable[[Record], bool], exc: ProtocolError
    ) -> None:
        """Fail the call at once when its own answer carries what we refuse (a pickle from
        a worker, say), instead of waiting out the deadline for an answer that came."""
        try:
            opaque = decode(frames, unpickle=False)
        except ProtocolError:
            return
        if match(opaque):
            raise ProtocolError(f"the answer could not be accepted: {exc}") from None
