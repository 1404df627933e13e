"""The broker's decision logic: messages and timer ticks in, messages to send out. No I/O.

``BrokerState.handle(peer, msg, now, raw, who=who)`` and ``tick(now)`` return a list of
:class:`Send` actions; the ZeroMQ shell in ``daemon.py`` performs them. Everything here is
driven by explicit timestamps, so tests run it without sockets or sleeps.

Every message is judged by who really sent it, never by a field the sender wrote:

* a worker's answers (``Done``, ``Failed``, ``Reply``, ``Ack``) count only when they come
  from the socket (or result channel) registered for the rank they name, in secure mode
  also from that node's key, and only for calls sent to that rank; others are dropped and
  counted (``forged_replies``);
* a driver is an identity (``driver:<name>``): its key in secure mode, the name its
  routing id declares in plaintext mode (:mod:`mpl.wire.routing`). Sessions belong to the
  identity that opened them and the ones it shares them with; programs are cached per
  identity; a ``sym:`` value is read only once loaded into the caller's own session.

Families of handlers live beside it, each a small class over this state: workers and
heartbeats (``presence.py``), sessions opened and closed (``session_calls.py``), names
(``names.py``), fetches and deletes (``data.py``), listings (``listing.py``), programs
(``program_store.py``), each rank's Done gathered into its job's answer
(``done_gathering.py``); the checks they share are ``access.py`` and ``admission.py``. What
stays here is the dispatch and the jobs: started, failed and cancelled.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from operator import attrgetter
from typing import Any

from mpl.broker.access import Access
from mpl.broker.actions import Send, box_execs, fan, own_execs
from mpl.broker.admission import refuse_call
from mpl.broker.calls import Call, CallTable, JobCall, RequestCall
from mpl.broker.data import DataCalls
from mpl.broker.done_gathering import DoneGathering
from mpl.broker.job_saves import JobSaves
from mpl.broker.listing import Listing
from mpl.broker.names import Names
from mpl.broker.persisted import PersistedTable
from mpl.broker.presence import Presence
from mpl.broker.program_store import ProgramStore
from mpl.broker.registry import Registry
from mpl.broker.session_calls import SessionCalls
from mpl.broker.session_runtime import SessionRuntimes
from mpl.broker.sessions import SessionTable
from mpl.broker.status_view import build_status
from mpl.wire.cluster import ClusterSpec
from mpl.wire.control import (
    HEARTBEAT_LIVENESS,
    HEARTBEAT_S,
    Bye,
    Channel,
    Heartbeat,
    Refused,
    WorkerHello,
)
from mpl.wire.data import Delete, Fetch
from mpl.wire.hot_spans import (
    execs_for_ranks,
)
from mpl.wire.jobs import (
    Abort,
    Cancel,
    Done,
    Exec,
    Failed,
    JobResult,
    Program,
    program_nbytes,
)
from mpl.wire.limits import (
    BROKER_PROGRAM_BYTES,
    MAX_HEARTBEAT_S,
    MAX_MESSAGE,
    MAX_PERSISTED_NAMES,
    MIN_HEARTBEAT_S,
    check_ranks,
    heartbeat_ok,
)
from mpl.wire.lru import LRU, SizedLRU
from mpl.wire.progress import EVERY_S, Progress
from mpl.wire.record import Record, replaced
from mpl.wire.remote import ErrorInfo
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC
from mpl.wire.sessions import (
    Ack,
    CloseNamed,
    CloseSession,
    DeleteSymbol,
    ListRequest,
    LoadSymbol,
    OpenSession,
    Reply,
    SaveSymbol,
    StatusRequest,
)

__all__ = ["BrokerState", "Send"]

_EMPTY_BIN = b"\xc4\x00"  # msgpack's empty bin: a refused stats blob in a spliced answer

_peer_of = attrgetter("peer")
# an entry of the program_used LRU set without its __setitem__ (a Python call per job)
_set_entry = OrderedDict.__setitem__
PROGRAM_CACHE = 1024
RECENT_ERRORS = 20
MAX_NOTE_CHARS = 512  # characters kept of each recent error
_FROM_WORKERS: frozenset[type[Record]] = frozenset({Done, Failed, Reply, Ack, Progress})
_FROM_ANYONE: frozenset[type[Record]] = frozenset(
    {WorkerHello, Channel, Heartbeat, Bye, StatusRequest}
)


def _error(kind: str, message: str, **kw: Any) -> ErrorInfo:
    return ErrorInfo(kind, message, **kw)


class BrokerState:
    """Registry of ranks, sessions, calls in flight and deadlines, for one cluster."""

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        now: float,
        broker_id: str = "",
        heartbeat_s: float = HEARTBEAT_S,
        liveness: int = HEARTBEAT_LIVENESS,
        secure: bool = False,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        # The workers' own test of a Welcome's interval: one they would refuse is refused
        # here, at the start (a bool is a mistake, not a number of seconds).
        if not heartbeat_ok(heartbeat_s):
            raise ValueError(
                f"heartbeat_s must be a number within [{MIN_HEARTBEAT_S}, {MAX_HEARTBEAT_S}] s "
                f"(the range a worker takes from its broker), got {heartbeat_s!r}"
            )
        self.cluster = cluster
        # Secure mode: `who` (the authenticated sender) decides who may speak for a rank.
        self.secure = secure
        self.broker_id = broker_id or f"b{secrets.token_hex(4)}"
        self.heartbeat_s = heartbeat_s
        self.silence_s = heartbeat_s * liveness
        # the router's MAXMSGSIZE, announced to drivers and workers (SessionOpened, Welcome)
        # so they refuse a bigger message before sending it rather than lose the connection
        self.max_message = max_message
        self.started = now
        self.registry = Registry(cluster.world_size)
        self.sessions = SessionTable(len(cluster.drivers) if secure else 0)
        self.calls = CallTable()
        self.drivers: dict[bytes, float] = {}  # driver sockets -> last seen
        self.beating: set[bytes] = set()  # driver sockets that heartbeat (and get beats back)
        self.programs: SizedLRU[tuple[str, str], Program] = SizedLRU(  # (driver, digest)
            PROGRAM_CACHE, BROKER_PROGRAM_BYTES
        )
        self.program_used: LRU[tuple[str, str], float] = LRU(PROGRAM_CACHE)  # when, for listing
        self.persisted = PersistedTable(MAX_PERSISTED_NAMES)  # (name, rank): each party's own
        self.errors: deque[str] = deque(maxlen=RECENT_ERRORS)
        self.counters = {"jobs_done": 0, "jobs_failed": 0, "bytes_routed": 0, "protocol_errors": 0}
        self.access = Access(cluster, self.registry, self.sessions, self.counters, self._note)
        self.names = Names(self)
        self.job_saves = JobSaves(self)
        self.data = DataCalls(self)
        self.listing = Listing(self)
        self.program_store = ProgramStore(self)
        self.runtimes = SessionRuntimes(self)
        self.presence = Presence(self)
        self.session_calls = SessionCalls(self)
        self.dones = DoneGathering(self)  # each rank's Done: the shell reads most itself
        self._next_beat = now
        self._handlers: dict[
            type[Record], Callable[[bytes, Any, float, str | None], list[Send]]
        ] = {
            WorkerHello: self.presence.on_hello,
            Channel: self.presence.on_channel,
            Heartbeat: self.presence.on_heartbeat,
            Bye: self.presence.on_bye,
            OpenSession: self.session_calls.on_open,
            CloseSession: self.session_calls.on_close,
            Program: self.program_store.on_program,
            Failed: self._on_failed,
            Progress: self._on_progress,
            Cancel: self._on_cancel,
            Fetch: self.data.on_fetch,
            Reply: self.data.on_worker_reply,
            Ack: self.names.on_ack,
            Delete: self.data.on_delete,
            SaveSymbol: self.names.on_save,
            LoadSymbol: self.names.on_load,
            DeleteSymbol: self.names.on_unsave,
            StatusRequest: self._on_status,
            ListRequest: self.listing.on_list,
            CloseNamed: self.listing.on_close_named,
        }
        # The messages the broker forwards on every job: their handlers also get the frames
        # the message came in, to pass on as they are (mpl.wire.hot).
        self._forwarders: dict[
            type[Record], Callable[[bytes, Any, float, str | None, Any], list[Send]]
        ] = {Exec: self._on_exec, Done: self.dones.on_done}

    @property
    def jobs_in_flight(self) -> int:
        """How many jobs have started and not yet ended (the shell reads queued messages
        only when a batch could form: with more than one)."""
        return len(self.calls.jobs)

    # -- entry points ---------------------------------------------------------------------
    def handle(
        self, peer: bytes, msg: Record, now: float, raw: Any = None, who: str | None = None
    ) -> list[Send]:
        """React to one decoded message from ``peer`` (``raw``: the frames it came in).

        ``who`` is the sender's authenticated identity (secure mode: ``node:<name>`` or
        ``driver:<name>``, from the CURVE key its connection proved), or ``None`` in plaintext
        mode, where the routing identity ``peer`` is what there is to go by.
        """
        if self.secure and isinstance(msg, (WorkerHello, Channel)):
            impostor = self.presence.impostor(peer, msg.rank, who, msg.TAG)
            if impostor is not None:
                return [impostor]
        worker = self.registry.worker(peer)
        if worker is not None:
            worker.last_seen = now
        kind = type(msg)
        forward = self._forwarders.get(kind)
        handler = self._handlers.get(kind) if forward is None else None
        if forward is None and handler is None:
            return [self._refuse(peer, "ProtocolError", f"unexpected message {msg.TAG!r}")]
        if kind not in _FROM_ANYONE:
            if kind in _FROM_WORKERS and worker is None:
                self._note(f"dropped {msg.TAG!r} from a peer that is not a registered worker")
                return []  # maybe a worker socket from before a restart: nobody reads replies
            if kind not in _FROM_WORKERS and worker is not None:
                return [self._refuse(peer, "ProtocolError", f"a worker may not send {msg.TAG!r}")]
            if worker is None:
                if self.access.driver(peer, who) is None:
                    return [self._not_a_driver(peer, who, msg.TAG)]
                self.drivers[peer] = now
        if forward is not None:
            return forward(peer, msg, now, who, raw)
        assert handler is not None
        return handler(peer, msg, now, who)

    def exec_read(
        self, peer: bytes, msg: Exec, now: float, raw: Any, who: str | None = None
    ) -> list[Send]:
        """An Exec of the hot path (``mpl.wire.hot.read_exec`` read and checked it): the
        checks :meth:`handle` makes on an Exec (no worker may send one; the sender must be a
        driver, by its key in secure mode), without the dispatch over every message kind."""
        registry = self.registry  # registry.worker(peer), written out: a call per job
        worker = registry.by_peer.get(peer) or registry.channels.get(peer)
        if worker is not None:
            worker.last_seen = now
            return [self._refuse(peer, "ProtocolError", f"a worker may not send {msg.TAG!r}")]
        identity = self.access.driver(peer, who)
        if identity is None:
            return [self._not_a_driver(peer, who, msg.TAG)]
        self.drivers[peer] = now
        return self._exec(peer, msg, now, who, raw, identity)

    def _not_a_driver(self, peer: bytes, who: str | None, tag: str) -> Send:
        """The refusal for a message only a driver may send, from a peer that is none."""
        return self._refuse(
            peer, "AuthenticationError", f"{who} is not a driver: it may not send {tag!r}"
        )

    def protocol_error(self, peer: bytes, error: Exception) -> list[Send]:
        """A message from ``peer`` did not decode: count it and tell the sender."""
        self.counters["protocol_errors"] += 1
        return [self._refuse(peer, "ProtocolError", f"bad message: {error}")]

    def disconnected(self, peer: bytes, now: float) -> list[Send]:
        """The transport saw ``peer``'s connection close."""
        if peer in self.registry.by_peer:
            return self.presence.lose_worker(peer, "its connection closed", now)
        self.drivers.pop(peer, None)
        self.beating.discard(peer)
        return []

    def tick(self, now: float) -> list[Send]:
        """Timers: heartbeats out, silent workers and expired sessions."""
        out: list[Send] = []
        for entry in self.registry.silent(now, self.silence_s):
            out += self.presence.lose_worker(
                entry.peer, f"silent for {now - entry.last_seen:.1f} s", now
            )
        for session in self.sessions.expired(now):
            out += self.session_calls.close_session(
                session.sid, f"lease of {session.lease_s:g} s expired"
            )
        for peer, seen in list(self.drivers.items()):
            if now - seen > self.silence_s:  # a driver socket that went quiet
                del self.drivers[peer]
                self.beating.discard(peer)
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_s
            beat = Heartbeat()
            out += [Send(p, beat) for p in self.registry.by_peer]
            out += [Send(p, beat) for p in self.beating]
        return out

    def next_deadline(self) -> float:
        return self._next_beat

    # -- jobs -----------------------------------------------------------------------------
    def _on_exec(
        self, peer: bytes, msg: Exec, now: float, who: str | None = None, raw: Any = None
    ) -> list[Send]:
        return self._exec(peer, msg, now, who, raw, self.access.driver(peer, who))

    def _exec(
        self,
        peer: bytes,
        msg: Exec,
        now: float,
        who: str | None,
        raw: Any,
        identity: str | None,
    ) -> list[Send]:
        """Start job ``msg`` from the driver ``identity`` (``access.driver(peer, who)``)."""
        job_id, ranks, digest, bindings = msg.job, msg.ranks, msg.digest, msg.bindings
        # check_ranks, written out for the answer it gives on every job (it says why, with
        # the job's name, when it refuses)
        calls, pending = self.calls, set(ranks)  # the ranks whose Done the job waits for
        if not ranks or len(pending) != len(ranks):
            refusal = check_ranks(ranks, f"job {job_id}")
            assert refusal is not None  # its checks, made above
            return self._answer(peer, job_id, _error("ProtocolError", refusal, job=job_id))
        if refusal := refuse_call(calls):
            return self._answer(peer, job_id, _error("ProtocolError", refusal, job=job_id))
        # access.session_of, written out for a session the sender may act in (three calls
        # on every job); anything else it answers, and says why
        found = self.sessions.by_id.get(msg.session)
        if (
            found is not None
            and identity is not None
            and (identity == found.owner or identity in found.shared)
        ):
            found.last_seen = now
            session = found
        else:
            checked = self.access.session_of(identity, who, msg.session, now)
            if isinstance(checked, ErrorInfo):
                return self._answer(peer, job_id, checked)
            session = checked
        assert identity is not None  # session_of refuses a sender that is no driver
        if bindings:
            unreadable = self.access.unreadable_binding(session, bindings)
            if unreadable is not None:
                return self._answer(peer, job_id, self.access.unloaded(session, unreadable))
        key = (identity, digest)
        program = self.programs.get(key)
        if program is None:
            return self._answer(peer, job_id, None, missing=True)
        used = self.program_used  # LRU.__setitem__ written out for a program used before
        if key in used:  # (most jobs): its time set and made the newest, no eviction due
            _set_entry(used, key, now)
            used.move_to_end(key)
        else:
            used[key] = now  # the LRU's own: a new entry may push out the oldest
        if job_id in calls.jobs:
            error = _error("ProtocolError", f"job id {job_id!r} is already running")
            return self._answer(peer, job_id, error)
        by_rank = self.registry.by_rank
        workers = list(map(by_rank.get, ranks))
        if not all(workers):  # a WorkerEntry is always true
            absent = next(r for r, e in zip(ranks, workers, strict=True) if e is None)
            return self._answer(peer, job_id, self._absent(absent, job_id))
        calls.jobs[job_id] = JobCall(peer, msg.session, ranks, pending, job_id, identity)
        session.jobs.add(job_id)
        # A rank must see only its own bindings (host values are private to their party).
        # When no other rank's bindings are in the message, it goes out as it came: one
        # Send for every rank, the same frames. Otherwise each rank's Exec is the arrived
        # header with the other ranks' bindings cut out (mpl.wire.hot_spans), or, when the message
        # has buffer frames, encoded anew. A sealed Exec whose boxes follow its header
        # (mpl.wire.sealed_exec) has none in it: each rank gets the header and its own box.
        shared = set(bindings) <= {ranks[0]} if len(ranks) == 1 else not bindings
        out: list[Send] = []  # a rank's program goes before its Exec
        for entry in workers:
            assert entry is not None  # None in workers was answered above
            # the same program as this worker's last job: no call (needs_program's check)
            if entry.last_program != key and entry.needs_program(
                key, partial(program_nbytes, program, entry.rank)
            ):
                out.append(Send(entry.peer, program))
        peers = list(map(_peer_of, workers))
        if raw is not None and raw[0] is SEALED_EXEC_MAGIC:  # (the shell's constant)
            # one header and a box per rank: each rank the header and its box, nothing cut
            return out + box_execs(peers, msg, raw)
        if shared:
            return out + fan(peers, msg, raw)
        # each rank's record and header made in one call each, not per rank
        return out + own_execs(peers, msg, None if raw is None else execs_for_ranks(raw, ranks))

    def _answer(
        self, peer: bytes, job: str, error: ErrorInfo | None, missing: bool = False
    ) -> list[Send]:
        """The answer to a job :meth:`_exec` does not start: its error, or that the broker
        lacks its program."""
        self.counters["jobs_failed"] += error is not None
        return [Send(peer, JobResult(job, error=error, missing_program=missing))]

    def _absent(self, rank: int, job: str = "") -> ErrorInfo:
        lost = self.registry.lost.get(rank)
        why = f"lost: {lost.reason}" if lost else "never registered"
        return _error(
            "WorkerLostError",
            f"rank {rank} has no live worker ({why}); start one with `mpl-worker --broker "
            f"URL --rank {rank}` (`mpl-broker status URL` shows the ranks that are up)",
            rank=rank,
            job=job,
        )

    def _on_failed(
        self, peer: bytes, msg: Failed, now: float, who: str | None = None
    ) -> list[Send]:
        if not self.access.speaks_for(peer, who, msg.rank, msg.TAG):
            return []
        job = self.calls.jobs.get(msg.job)
        if job is None or msg.rank not in job.ranks or msg.session != job.session:
            return []
        error = msg.error
        if error.rank != msg.rank:  # the worker speaks for its own rank alone: a driver
            # reads the refusing rank from the error (DriverSeal.refused), so the rank
            # checked above is the one forwarded
            if error.rank is not None:  # a lie: counted, as a forged answer is
                self.counters["forged_replies"] += 1
                self._note(f"rewrote rank {error.rank} as {msg.rank} in rank {msg.rank}'s Failed")
            error = replaced(error, rank=msg.rank)
        self._note(f"job {msg.job} failed on rank {msg.rank}: {error.message[:200]}")
        return self._fail_call(job, error, failed=msg.rank)

    def _on_progress(
        self, peer: bytes, msg: Progress, now: float, who: str | None = None
    ) -> list[Send]:
        """Forward a rank's progress to the job's driver: only from the worker serving that
        rank (with its key in secure mode), for a job in flight that still waits on it, and
        throttled per job and rank."""
        if not self.access.speaks_for(peer, who, msg.rank, msg.TAG):
            return []
        job = self.calls.jobs.get(msg.job)
        if job is None or msg.rank not in job.pending or msg.session != job.session:
            return []
        if now - job.progress_sent.get(msg.rank, -EVERY_S) < EVERY_S * 0.8:
            return []
        job.progress_sent[msg.rank] = now
        return [Send(job.driver, msg)]

    def _on_cancel(
        self, peer: bytes, msg: Cancel, now: float, who: str | None = None
    ) -> list[Send]:
        job = self.calls.jobs.get(msg.job)
        if job is None:
            return []
        session = self.access.session(peer, who, job.session)
        if isinstance(session, ErrorInfo) or msg.session != job.session:
            self._note(f"ignored a cancel of job {msg.job} from {self.access.driver(peer, who)}")
            return []
        return self._fail_call(
            job, _error("JobAbortedError", f"cancelled: {msg.reason}", job=msg.job)
        )

    def _fail_call(self, call: Call, error: ErrorInfo, failed: int | None = None) -> list[Send]:
        """End ``call`` with ``error``: answer its driver once and release its other ranks
        (all but ``failed``, the rank that reported the failure, or else ``error.rank``)."""
        skip = error.rank if failed is None else failed
        out: list[Send] = []
        if isinstance(call, JobCall):
            if self.calls.jobs.pop(call.job, None) is None:
                return []
            self.job_saves.ending(call, failed)  # a rank yet to answer may have saved
            self._session_jobs_discard(call)
            self.counters["jobs_failed"] += 1
            out.append(Send(call.driver, JobResult(call.job, error=error)))
            abort = Abort(call.session, call.job, error)
            # every rank drops the job, including those that finished (their outputs are orphans)
            out += [
                Send(e.peer, abort)
                for r in call.ranks
                if (e := self.registry.by_rank.get(r)) is not None and r != skip
            ]
        elif isinstance(call, RequestCall) and self.calls.requests.pop(call.bid, None) is not None:
            out.append(Send(call.driver, Reply(call.req, error=error)))
        return out

    def _session_jobs_discard(self, job: JobCall) -> None:
        session = self.sessions.get(job.session)
        if session is not None:
            session.jobs.discard(job.job)

    # -- status ---------------------------------------------------------------------------
    def _on_status(
        self, peer: bytes, msg: StatusRequest, now: float, who: str | None = None
    ) -> list[Send]:
        if who is None:
            return [Send(peer, Reply(msg.req, value=self.status(now)))]
        identity = self.access.driver(peer, who)
        if identity is None:
            self.counters["refused_requests"] += 1
            error = _error("AuthenticationError", f"{who} is not a driver: no status for it")
            return [Send(peer, Reply(msg.req, error=error))]
        return [Send(peer, Reply(msg.req, value=self.status(now, viewer=identity)))]

    def status(self, now: float, viewer: str | None = None) -> dict[str, Any]:
        """The status table; ``viewer`` (a driver identity, secure mode) sees its own
        sessions in full, the others only as a count, and no recent errors."""
        return build_status(self, now, viewer)

    # -- helpers --------------------------------------------------------------------------
    def _refuse(self, peer: bytes, kind: str, message: str) -> Send:
        self._note(message)
        return Send(peer, Refused(_error(kind, message)))

    def _req_error(self, req: int, kind: str, message: str) -> Reply:
        return Reply(req, error=_error(kind, message))

    def _note(self, text: str) -> None:
        # a note quotes what a peer sent (a session id, a host name, a reason): kept short,
        # or 20 notes of 16 MiB headers' fields would be kept and shown in every status
        self.errors.append(text[:MAX_NOTE_CHARS])
