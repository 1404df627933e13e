"""The low-level driver client: what the driver asks the broker (sessions, jobs, fetches,
names, status), each with a deadline.

Every calling thread gets its own DEALER socket and waits for its answer on it
(:mod:`mpl.driver.calls`, the client's base); jobs in flight without waiting go through the
client's pump (:mod:`mpl.driver.inflight`). A :class:`~mpl.driver.watch.BrokerWatch`
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

import itertools
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import zmq

from mpl.driver.calls import BrokerCalls
from mpl.driver.inflight import JobPump, Pending
from mpl.driver.job_future import INTERRUPTED, JobFuture
from mpl.driver.job_progress import ProgressBoard
from mpl.driver.sent_programs import SentPrograms
from mpl.driver.watch import BrokerWatch
from mpl.wire.codec import to_wire
from mpl.wire.control import HEARTBEAT_S
from mpl.wire.curve import Curve
from mpl.wire.data import Fetch
from mpl.wire.endpoints import check_endpoint
from mpl.wire.errors import AuthenticationError, MplError, MplTimeoutError, ProtocolError
from mpl.wire.exec_pack import delete_frames
from mpl.wire.graph import Graph
from mpl.wire.identity import driver_identity
from mpl.wire.jobs import Cancel, Exec, JobResult, Program
from mpl.wire.record import pinned_fields
from mpl.wire.remote import from_info
from mpl.wire.routing import check_driver_name
from mpl.wire.safe_values import BROKER, WORKER, pickles_allowed
from mpl.wire.session_word import binds_owner, id_of_session_named
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
from mpl.wire.sockets import announced_limit, send_frames

if TYPE_CHECKING:
    from mpl.driver.sealing import DriverSeal

__all__ = ["INPROC_CONTEXTS", "Client"]

# inproc:// endpoints only exist inside one ZeroMQ context: in-process clusters register
# theirs here, so a Client (or mp.connect) given such an address can reach it.
INPROC_CONTEXTS: dict[str, zmq.Context[Any]] = {}

log = logging.getLogger("mpl.driver")
_REPORT_GRACE_S = 1.0
# Client._exec fills its Execs in directly, naming every field (keywords): pinned here
_EXEC_FIELDS = pinned_fields(
    Exec,
    ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s"),
    "mpl.driver.client",
    direct=True,
)


class _JobIds:
    """Unguessable job ids, drawn from the OS's CSPRNG a batch at a time: one ``getrandom``
    call per ``_BATCH`` jobs instead of one per job.

    ``pool`` is an iterator over the batch's ids: ``next(ids.pool, None) or ids.refill()``
    takes one without a Python call or a lock (a list iterator hands each item out once,
    under the GIL, whichever threads ask). A forked child drops its parent's batch before
    it runs anything (``_forget_in_child``): it must never repeat its parent's ids.
    """

    _BATCH = 256
    _BYTES = 12

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pool: Iterator[str] = iter(())
        _live_ids.add(self)

    def next(self) -> str:
        return next(self.pool, None) or self.refill()

    def refill(self) -> str:
        """The batch ran out: one id of a new one (another thread may have drawn it)."""
        with self._lock:
            job = next(self.pool, None)
            if job is not None:
                return job
            hexed = os.urandom(self._BYTES * self._BATCH).hex()
            width = 2 * self._BYTES
            batch = [hexed[at : at + width] for at in range(0, len(hexed), width)]
            self.pool = iter(batch[1:])
            return batch[0]

    def _forget(self) -> None:
        self._lock = threading.Lock()  # a lock another thread held at the fork stays held
        self.pool = iter(())


_live_ids: weakref.WeakSet[_JobIds] = weakref.WeakSet()


def _forget_in_child() -> None:
    for ids in list(_live_ids):
        ids._forget()


os.register_at_fork(after_in_child=_forget_in_child)


class Client(BrokerCalls):
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
        self.address = check_endpoint(address)  # a typo must not leave the open waiting
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
        self.ctx = context or zmq.Context()
        super().__init__()
        self._reqs = itertools.count(1)
        self._job_ids = _JobIds()
        self._programs = SentPrograms()  # bounded: see mpl.driver.sent_programs
        self.sessions: set[str] = set()
        self.progress = ProgressBoard()  # jobs in flight: where their ranks are
        self.broker_id = ""
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
        # In secure mode every answer is the broker's, which ships no code however trusted
        # the parties are: decoded safely, its sealed values opened (and, trusted, unpickled)
        # by the seal once a worker's key authenticated them (DriverSeal.safe)
        secure = self.curve is not None
        self.safe = not (
            pickles_allowed(WORKER, trusted=value)
            and pickles_allowed(BROKER, trusted=value, secure=secure)
        )

    # -- sessions -------------------------------------------------------------------------
    def open_session(
        self,
        name: str = "",
        *,
        lease_s: float = 60.0,
        share_with: list[str] | None = None,
        cluster: dict[str, Any] | None = None,
        owner: str | None = None,
    ) -> SessionOpened:
        """Open a session, or attach to the named one.

        ``share_with`` names the drivers (besides this one) that may attach to the session
        and act in it; only the session's owner may set it (a list replaces the previous one).
        Raises ``SessionAccessError`` when the named session belongs to another driver.
        ``cluster`` (a spec's dict form) gives the session its own devices over named nodes
        of the broker's cluster; the broker refuses it with ``ClusterSpecError``.

        A session's id is its name and a tail (``<name>~<24 base64url characters>``: a
        random part and its owner's tag, ``mpl.wire.session_word.session_id``); this
        driver names a session opened without one itself (``s`` and 16 random hex
        digits). Raises
        ``AuthenticationError`` when the broker answers with an id of another name, says a
        freshly named session already existed, or answers an open as new, or one with
        ``share_with``, with an id naming another driver as its owner (secure mode), or,
        given ``owner`` (a driver name), with an id not naming that driver as its owner: a
        broker putting this driver's values in a session it did not ask for. Nothing was
        done in that session; check which broker you reach (its operator may be hostile).
        ``owner`` is what an attach without ``share_with`` (the owner's other client, a
        sharee) knows of whose session it means; without it such an attach takes the
        session of its name whatever driver the id names (README, Limitations).
        """
        fresh = not name
        if fresh:  # the id is chosen here, not by the broker: see the check below
            name = f"s{secrets.token_hex(8)}"
        req = next(self._reqs)
        share = None if share_with is None else [check_driver_name(n) for n in share_with]
        # the owner asked for, as the broker names owners (driver:<name>, in either mode)
        meant = None if owner is None else driver_identity(check_driver_name(owner))
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
        sid = opened.session
        # owned: opened now, or share_with set (the broker lets only the owner do either),
        # so its id must name this driver as its owner (a worker lets no one else bind it)
        sealer = None if self.seal is None else self.seal.sealer
        not_owned = (
            sealer is not None
            and (not opened.attached or share is not None)
            and not binds_owner(sid, sealer.identity)
        )
        # an id naming another owner than the one asked for (the owner's own name: its other
        # clients; the sharer's: a sharee) is a session of another driver's the broker
        # seats this client in, where it would act as a member (README, Limitations)
        not_meant = meant is not None and not binds_owner(sid, meant)
        not_owned = not_owned or not_meant
        if not id_of_session_named(sid, name) or (fresh and opened.attached) or not_owned:
            # detach from what an honest (older) broker opened: by its id, as the broker
            # reads a close (a name finds nothing: the session stayed open to its lease)
            self._send(CloseSession(sid, self.client_id))
            raise AuthenticationError(
                f"the broker answered the open of session {name!r} with session "
                f"{sid!r}{' (attached)' if opened.attached else ''}: not the one asked for"
                f"{', its id naming another owner' if not_owned else ''}"
                f"{f' than {owner!r}' if not_meant else ''}, so this driver "
                "will not act in it"
            )
        self.max_message = announced_limit(opened.max_message)
        if opened.broker_id != self.broker_id:
            self.broker_id = opened.broker_id
            self._programs.clear()
        self.sessions.add(opened.session)
        return opened

    def close_session(self, session: str) -> None:
        self.sessions.discard(session)
        if self.seal is not None:
            self.seal.words.pop(session, None)
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
        again: bool = True,
    ) -> JobResult:
        """Run ``graph`` as one job and wait for its result; raises the job's error.

        Secure mode: a job a worker refused as sealed for no process of its node (one that
        joined after the session opened) runs once more, as a new job sealed for the
        process the refusal names (``DriverSeal.refused``; ``again``: not done yet for this
        call); one sealed for the process before a restart raises the refusal.

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
                result = self._job_call(msg, deadline, limit, _REPORT_GRACE_S)
            except MplTimeoutError:
                self.progress.end(job, False)
                self._send(Cancel(session, job, f"the driver stopped waiting after {limit:g} s"))
                raise
            except KeyboardInterrupt:  # Ctrl-C: the job's other ranks stop waiting too
                self.progress.end(job, False)
                self._send(Cancel(session, job, INTERRUPTED))
                raise
            if not result.missing_program:
                if result.error is not None:
                    # a worker that forgot our stream: a new one, and the job again (as a
                    # new job) if it was sealed for no process (DriverSeal.refused)
                    if seal is not None and seal.refused(result.error, msg.bindings) and again:
                        return self.submit(
                            session, graph, bindings, inline=inline, timeout=timeout, again=False
                        )
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
        pending = Pending(msg, graph, deadline, limit, JobFuture(self._interrupt), finish, keep)
        if self.seal is not None:
            # the bindings kept, to seal anew if a worker refuses them, only when the job
            # may be sent again then: otherwise they go once sealed
            if self.seal.may_send_again(msg.ranks):
                pending.plain = msg.bindings
            pending.msg = self.seal.exec(msg)
        self.progress.begin(msg.job)  # ended when its JobResult arrives
        pump = self._pump  # (not `or`: a JobPump's truth is its length)
        if pump is None:
            pump = self._job_pump()
        pump.put(pending)
        future = pending.future  # RUNNING already: jobs are not taken back once handed over
        return future

    def _interrupt(self, future: JobFuture) -> None:
        """Ctrl-C in a wait on ``future``: its job is cancelled (by the pump that sent it)."""
        pump = self._pump
        if pump is not None:
            pump.interrupt(future)

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
        job = (
            next(self._job_ids.pool, None) or self._job_ids.refill()
        )  # unguessable: no one can prepare traffic for it
        ranks = graph.ranks
        for rank in bindings:
            if rank not in ranks:
                ranks = tuple(sorted({*ranks, *bindings}))
                break
        # Exec(...) filled in directly, as _EXEC_FIELDS pins it: a record this driver builds
        # from its own parts per job, so it skips the generated __init__ and the guarded
        # __setattr__ per field (the broker checks every field it receives). With keywords:
        # a __dict__ filled key by key makes every later read of a field about 3x slower.
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
            frames = to_wire(delete_frames(session, uris))
            send_frames(self._socket(), frames, 0)  # blocks at most SNDTIMEO
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
        if self.seal is not None:  # workers that joined since: seal for them from now on
            self.seal.learn(value.get("ranks"))
        return value

    def close(self) -> None:
        """Stop heartbeating and close every socket (LINGER is short: never hangs)."""
        if self._closed:
            return
        self.abandon_jobs("the client was closed while the job was in flight")
        self._closed = True
        self.watch.close()
        self._close_sockets()
        if self._own_context:
            self.ctx.term()
