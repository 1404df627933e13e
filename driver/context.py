"""Contexts: one session on a cluster, and which context is current in each thread.

``with ctx:`` makes ``ctx`` current in this thread for the block (contexts nest, and any
thread may enter any context); ``mp.set_context(ctx)`` makes it the default of threads with
no ``with`` active. ``ctx.close()`` ends the session: the workers free everything it held.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

from mpl.driver.client import Client
from mpl.wire.cluster import ClusterSpec
from mpl.wire.curve import Curve
from mpl.wire.errors import AuthenticationError, MplError, ProtocolError
from mpl.wire.graph import Graph
from mpl.wire.jobs import JobResult
from mpl.wire.keys import is_z85_key, load_keypair
from mpl.wire.run_stats import RunStats, read_stats
from mpl.wire.session_cluster import session_cluster
from mpl.wire.status import format_status

__all__ = [
    "ENTERED",
    "STACK",
    "Context",
    "Status",
    "connect",
    "current",
    "get_context",
    "set_context",
]

_DELETE_BATCH = 256
_DELETE_EVERY_S = 1.0
_JOB_MEMORY = 64  # jobs kept for mp.trace()


class _Stack(threading.local):
    def __init__(self) -> None:
        self.contexts: list[Context] = []


_stack = _Stack()
# the same, for a hot path that reads ``STACK.contexts`` itself before calling current()
STACK = _stack
# contexts entered (``with ctx:``) over all threads, changed under _counting: while none
# is, no thread's stack holds one, and current() and the hot paths skip the thread-local
# (~500 instructions an attribute); a thread counts itself before it pushes
ENTERED = [0]
_counting = threading.Lock()
_default: Context | None = None


def _recount_in_child() -> None:
    """A forked child runs this thread alone: a lock another thread held at the fork would
    never be released there (its first ``with ctx:`` would block for ever), and only this
    thread's entered contexts are the child's."""
    global _counting
    _counting = threading.Lock()
    ENTERED[0] = len(_stack.contexts)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_recount_in_child)


def current() -> Context:
    """The current context: the innermost ``with ctx:`` of this thread, else the default."""
    if ENTERED[0] and _stack.contexts:
        return _stack.contexts[-1]
    if _default is not None:
        return _default
    raise MplError(
        "no mpl context: create one and enter it, e.g. `with mp.Simulator.simple(2):`, "
        "`with mp.local_cluster(2):`, or call mp.set_context(mp.connect(url))"
    )


def get_context() -> Context | None:
    """The current context, or None."""
    try:
        return current()
    except MplError:
        return None


def set_context(ctx: Context | None) -> None:
    """Make ``ctx`` the default context of every thread (None clears it)."""
    global _default
    _default = ctx


class Status(dict[str, Any]):
    """The broker's status report: a dict, printed as the ``mpl-broker status`` table."""

    def __str__(self) -> str:
        return format_status(self)


class JobRecord(NamedTuple):
    """What ``mp.trace`` draws: one job's per-rank op spans (a tuple: one is kept per job,
    and building it must cost next to nothing). ``stats`` holds each rank's stats blob as
    the job's answer carried it, unread: :meth:`rank_stats` reads them."""

    job: str
    name: str
    started: float  # driver wall clock
    seconds: float
    stats: dict[int, bytes]

    def rank_stats(self) -> dict[int, RunStats | ProtocolError]:
        """Each rank's stats, read now (``mpl.wire.run_stats.read_stats``): a rank whose
        blob is unreadable (a hostile broker or party) gets the error saying why."""
        out: dict[int, RunStats | ProtocolError] = {}
        for rank, blob in self.stats.items():
            try:
                out[rank] = read_stats(blob)
            except ProtocolError as exc:
                out[rank] = exc
        return out


def job_stats(
    stats: dict[int, bytes], ranks: Collection[int], also: Collection[int] = ()
) -> dict[int, bytes]:
    """What a job's record keeps of its answer's ``stats``: the blobs of the job's ranks
    only (its graph's ``ranks``, and ``also`` those it binds inputs on, as its Exec names
    them). The answer comes through the broker, which may name any rank (each blob within
    ``MAX_STATS_BYTES``, which the read refuses past): a context keeps its last
    ``_JOB_MEMORY`` records, so blobs for ranks beyond the job's would pin memory without
    bound. ``stats`` itself when it names no other rank (an honest answer)."""
    for rank in stats:
        if rank not in ranks and rank not in also:
            return {r: stats[r] for r in stats if r in ranks or r in also}
    return stats


# what a job keeps for mp.trace: a JobRecord's fields as a plain tuple (built at no cost:
# one per job; tuple.__new__ of a JobRecord took ~900 instructions), made a JobRecord
# when the trace is written
JobRow = tuple[str, str, float, float, dict[int, bytes]]


class Context:
    """One session on a cluster, reached through a broker.

    ``with ctx:`` makes it the current context for the block (blocks nest, and may enter
    it again); it does not end the session: :meth:`close` does (its values are freed on the
    workers). A context left open keeps its session while this process heartbeats for it.
    """

    def __init__(
        self,
        client: Client,
        *,
        session: str = "",
        lease_s: float = 60.0,
        share_with: list[str] | None = None,
        cluster: ClusterSpec | None = None,
        owner: str | None = None,
    ) -> None:
        self.client = client
        opened = client.open_session(
            session,
            lease_s=lease_s,
            share_with=share_with,
            cluster=None if cluster is None else cluster.to_dict(),
            owner=owner,
        )
        self.session = opened.session
        self.name = session
        self.cluster = ClusterSpec.from_dict(opened.cluster)
        try:
            if cluster is not None:
                self.cluster = session_cluster(self.cluster, cluster)
            if client.seal is not None:  # secure mode: which rank is which node, for keys
                client.seal.bind(self.cluster, opened.incarnations)
                # and what its jobs tell the workers of who the session admits: the broker
                # lets only the owner open it or set share_with (and then the id names this
                # driver as its owner: open_session checks, and workers let no one else
                # bind it, so a member's jobs, claiming no say, run only where it is bound
                # to its owner)
                owns = not opened.attached or share_with is not None
                # (a grant of an open answered as new says so: no old binding takes it)
                client.seal.speak_for(self.session, owns, share_with, not opened.attached)
                # the owner binds the session to it on every worker before any value exists
                told = client.seal.word_job(self.session, self.cluster.world_size, owns)
                if told is not None:
                    self._bind_on_workers(*told)
        except BaseException:
            client.close_session(self.session)
            raise
        # deletes waiting to be sent: appended by any thread (a Value's __del__, the GC's
        # too) and taken by flush, each a single deque operation: no lock, so a Value
        # collected while a flush runs on the same thread never waits for it
        self._released: deque[tuple[tuple[int, ...], str]] = deque()
        self._flushed = time.monotonic()
        self._job_rows: deque[JobRow] = deque(maxlen=_JOB_MEMORY)
        self.closed = False

    def _bind_on_workers(self, graph: Graph, inline: tuple[int, ...]) -> None:
        """Secure mode, the session's owner: run the job binding the session to it on every
        live worker (``DriverSeal.word_job``), once more if a worker refused it as sealed for
        another process of its node (the refusal names the right one)."""
        seal = self.client.seal
        assert seal is not None
        for again in (True, False):
            try:
                result = self.client.submit(self.session, graph, {}, inline=inline)
            except AuthenticationError:
                if again:
                    continue
                raise
            seal.word_heard(self.session, graph, result.values)
            return

    @property
    def address(self) -> str:
        """The broker's URL."""
        return self.client.address

    # -- activation -----------------------------------------------------------------------
    def __enter__(self) -> Context:
        self._check_open()
        with _counting:
            ENTERED[0] += 1
        _stack.contexts.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        contexts = _stack.contexts
        if contexts and contexts[-1] is self:
            contexts.pop()
        elif self in contexts:
            contexts.remove(self)
        else:
            return
        with _counting:
            ENTERED[0] -= 1

    def close(self) -> None:
        """End the session; the workers free every value it held. Idempotent."""
        global _default
        if self.closed:
            return
        self.closed = True
        if _default is self:
            _default = None
        try:
            self.client.abandon_jobs(
                f"the context (session {self.session}) was closed while the job was in flight"
            )
            self.client.close_session(self.session)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self.client.close()

    def _check_open(self) -> None:
        if self.closed:
            raise MplError("this context is closed")

    # -- what values and programs use ------------------------------------------------------
    def run(
        self,
        graph: Graph,
        bindings: dict[int, list[Any]],
        *,
        inline: tuple[int, ...] = (),
        timeout: float | None = None,
        again: bool = True,
    ) -> JobResult:
        """Run ``graph`` as one job (after sending any deletes waiting in the batch);
        ``again``: as in ``Client.submit`` (False: this job was sent once more already)."""
        if self.closed:
            self._check_open()  # raises
        wall, start = time.time(), time.monotonic()
        released = self._released
        if released and (len(released) >= _DELETE_BATCH or start - self._flushed > _DELETE_EVERY_S):
            self.flush()  # _maybe_flush, written out: it runs before every job
        result = self.client.submit(
            self.session, graph, bindings, inline=inline, timeout=timeout, again=again
        )
        stats, ranks = result.stats, graph.ranks
        for rank in stats:  # a loop, no call: an honest answer names only the job's ranks
            if rank not in ranks and rank not in bindings:
                stats = job_stats(stats, ranks, bindings)
                break
        row = (result.job, graph.name, wall, time.monotonic() - start, stats)
        self._job_rows.append(row)
        return result

    def submit(
        self,
        graph: Graph,
        bindings: dict[int, list[Any]],
        finish: Callable[[JobResult], Any],
        *,
        keep: Any = None,
        inline: tuple[int, ...] = (),
        timeout: float | None = None,
    ) -> Future[Any]:
        """Start ``graph`` as one job without waiting: a future of ``finish(result)``.

        ``keep`` (the job's input Values) stays alive until the job has run.
        """
        if self.closed:
            self._check_open()  # raises
        wall, start = time.time(), time.monotonic()
        released = self._released
        if released and (len(released) >= _DELETE_BATCH or start - self._flushed > _DELETE_EVERY_S):
            self.flush()
        jobs, name, ranks = self._job_rows, graph.name, graph.ranks

        def record(result: JobResult) -> Any:  # on the pump thread
            stats = result.stats
            for rank in stats:  # as in run: no call for an honest answer
                if rank not in ranks and rank not in bindings:
                    stats = job_stats(stats, ranks, bindings)
                    break
            jobs.append((result.job, name, wall, time.monotonic() - start, stats))
            return finish(result)

        return self.client.submit_async(
            self.session, graph, bindings, finish=record, keep=keep, inline=inline, timeout=timeout
        )

    def fetch_raw(self, rank: int, uri: str, *, timeout: float | None = None) -> Any:
        self._check_open()
        self._maybe_flush()
        return self.client.fetch(self.session, rank, uri, timeout=timeout)

    def release(self, parties: tuple[int, ...], uri: str) -> None:
        """A Value was dropped: queue its deletion (safe from any thread, even the GC).
        ``Value.__del__`` writes this out."""
        if self.closed:
            return
        self._released.append((parties, uri))

    def _maybe_flush(self) -> None:
        """Before a job or fetch: send the queued deletes once a batch is full or old."""
        pending = self._released
        if pending and (
            len(pending) >= _DELETE_BATCH or time.monotonic() - self._flushed > _DELETE_EVERY_S
        ):
            self.flush()

    def flush(self) -> None:
        """Send the deletes queued by dropped Values now.

        Jobs and fetches do it by themselves once ``_DELETE_BATCH`` values are waiting or a
        second has passed; call this to free the workers' memory at once.
        """
        self._flushed = time.monotonic()
        released = self._released
        take = released.popleft
        batch: list[tuple[tuple[int, ...], str]] = []
        with contextlib.suppress(IndexError):  # another thread's flush took the rest
            for _ in range(len(released)):  # what is queued now; later ones: the next flush
                batch.append(take())
        if not batch or self.closed:
            return
        for start in range(0, len(batch), _DELETE_BATCH):
            # grouped by parties first (every output of a fan-out has the same ones): work
            # per value, not per value and rank; one group's list then serves its every rank
            groups: dict[tuple[int, ...], list[str]] = {}
            for parties, uri in batch[start : start + _DELETE_BATCH]:
                row = groups.get(parties)
                if row is None:
                    groups[parties] = [uri]
                else:
                    row.append(uri)
            uris: dict[int, list[str]]
            if len(groups) == 1:
                [(parties, row)] = groups.items()
                uris = dict.fromkeys(parties, row)  # one list for all (packed once)
            else:
                uris = {}
                for parties, row in groups.items():
                    for rank in parties:
                        uris.setdefault(rank, []).extend(row)
            self.client.delete(self.session, uris)

    def status(self, *, timeout: float | None = None) -> Status:
        """The cluster's status: ranks, liveness, sessions, jobs, bytes moved, errors.

        ``status()["progress"]`` holds this driver's own jobs in flight: per job the slowest
        rank's ``done``/``total`` ops and the ``op`` it runs, and every rank under ``ranks``.
        """
        report = Status(self.client.status(timeout=timeout))
        report["progress"] = self.client.progress.running()
        return report

    @property
    def jobs(self) -> list[JobRecord]:
        """The records of the last jobs (at most 64), oldest first: a new list each time."""
        # the rows copied first, in one C call: the pump thread records async jobs as they
        # end, and a row appended while the records are made would stop the deque's iterator
        return [JobRecord._make(row) for row in tuple(self._job_rows)]

    def trace(self, path: str, *, last: int | None = None) -> str:
        """Write a Chrome/Perfetto trace of the last jobs (all kept, or the ``last`` few) to
        ``path``; returns ``path``."""
        from mpl.driver.tracefile import write_trace

        jobs = self.jobs
        return write_trace(jobs[-last:] if last else jobs, self.cluster, path)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"session {self.session}"
        return (
            f"<{type(self).__name__} {self.address} {state}, world size {self.cluster.world_size}>"
        )


def connect(
    url: str,
    *,
    session: str | None = None,
    timeout: float = 30.0,
    lease_s: float = 60.0,
    trusted: bool = False,
    key: str | Path | None = None,
    cluster: ClusterSpec | str | Path | None = None,
    broker_key: str | None = None,
    share_with: list[str] | None = None,
    driver: str | None = None,
    owner: str | None = None,
) -> Context:
    """Attach to a running broker. ``session="name"`` creates or re-attaches that session.

    A session belongs to the driver that opened it. ``share_with=["auditor"]`` lets the
    named drivers attach to it too (``mp.connect(url, session="s", owner=...)`` as
    ``auditor``, naming the owner) and
    run, fetch, save, load, delete and close in it; only the owner may set it, when opening
    or re-attaching (a list replaces the previous one; ``[]`` takes the sharing back). In
    secure mode each such call is a grant the workers order by the time it was made (this
    client's clock): they keep the newest, whichever of the owner's clients made it, and a
    re-attach without ``share_with`` leaves it standing. A client that opened the session
    without ``share_with`` has its jobs refused (``SessionAccessError``) once another
    client of the owner shares it, and a worker that restarted (or evicted the session's
    closed binding) refuses a grant admitting others made before that: re-attach with
    ``share_with`` to grant again. Another driver attaching raises
    ``SessionAccessError``.

    ``owner="NAME"`` says whose session ``session`` is meant to be: the owner's own driver
    name for its other clients, the sharer's for a sharee (``mp.connect(url, session="s",
    owner="alice")`` as ``auditor``). A session's id names its owner, and an answer whose
    id names another raises ``AuthenticationError`` (nothing was done in it; checked in
    either mode, though a plaintext owner's name is declared, not proven). Without it an
    attach without ``share_with`` takes the session of that name whoever owns it: a hostile
    broker holding a listed driver's key can seat the client in that driver's session of
    the name, shared with it, and read what it computes there. Pass it on every attach
    without ``share_with``; an open or an attach with ``share_with`` is checked against
    this driver's own name anyway (secure mode).

    A driver's name is the one its key is pinned to in secure mode; in plaintext mode it is
    ``driver`` (default: a random name, so each connection is a driver of its own).

    ``cluster`` (a ``ClusterSpec`` or a path) is the session's own spec: its nodes are named
    nodes of the broker's cluster (any subset, any order: each keeps the broker's rank; in
    secure mode their keys must be the broker's, and jobs are sealed for them by name), and
    the session's devices are its devices, with their own SPU protocol, field and fxp bits,
    so sessions with different SPU settings run side by side over the same workers. A node
    the broker does not know, or a key that disagrees with the broker's, raises
    ``ClusterSpecError``. Without ``cluster`` the session uses the broker's spec.
    ``timeout`` bounds each control request; a broker that does not answer raises
    ``MplTimeoutError``. ``trusted=True`` accepts pickled results (a cluster one
    organisation runs end to end); the broker's spec cannot turn it on.

    Secure mode: ``key`` is this driver's secret key file (``mpl-keys new NAME``), and the
    broker's public key is pinned from ``cluster`` (your own copy of the spec, a path or a
    ``ClusterSpec``) or given as ``broker_key`` (z85). A broker that does not list this
    driver's key raises ``AuthenticationError`` within a few seconds.
    """
    spec = ClusterSpec.from_file(cluster) if isinstance(cluster, (str, Path)) else cluster
    client = Client(
        url,
        timeout=timeout,
        trusted=trusted,
        curve=_driver_curve(key, spec, broker_key),
        driver=driver,
    )
    try:
        return Context(
            client,
            session=session or "",
            lease_s=lease_s,
            share_with=share_with,
            cluster=spec,
            owner=owner,
        )
    except BaseException:
        client.close()
        raise


def _driver_curve(
    key: str | Path | None, cluster: ClusterSpec | str | Path | None, broker_key: str | None
) -> Curve | None:
    spec = ClusterSpec.from_file(cluster) if isinstance(cluster, (str, Path)) else cluster
    if key is None:
        if broker_key or (spec is not None and spec.secure):
            raise MplError("secure mode needs key= (this driver's NAME.key_secret file)")
        return None
    if broker_key is not None and not is_z85_key(broker_key):
        raise MplError("broker_key: expected the broker's 40-character z85 public key")
    if not broker_key and (spec is None or not spec.secure):
        raise MplError(
            "key= needs the broker's public key: pass cluster= (a spec that pins keys) "
            "or broker_key="
        )
    return Curve(load_keypair(key), spec, broker_key or "")
