"""Each rank's Done gathered into its job's answer: the broker's busiest handler. No I/O.

A Done counts only from the socket registered for the rank it names (in secure mode also
from that node's key), for a job in flight that still waits on that rank and in the job's
own session; anything else is dropped (and counted by ``Access.speaks_for``). Its values,
stats blob and metas go straight into the job's answer; when every rank has answered, the
job ends and its driver gets one ``JobResult``, packed in one call when every Done was
read by the lean reader (:func:`mpl.wire.hot.read_done`), else spliced or encoded.
A Done of the hot path comes read (:meth:`DoneGathering.read`), any other decoded
(:meth:`DoneGathering.on_done`). A stats blob that is no blob or over MAX_STATS_BYTES is
refused for that rank alone (its reader says "stats unreadable"); the result stands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpl.broker.actions import Send
from mpl.broker.calls import JobCall
from mpl.broker.registry import WorkerEntry
from mpl.wire.hot import DoneRead, packed_result, result_record
from mpl.wire.hot_spans import DoneSpans, done_spans, result_frames
from mpl.wire.jobs import Done
from mpl.wire.run_stats import MAX_STATS_BYTES, stats_blob

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["DoneGathering"]

_EMPTY_BIN = b"\xc4\x00"  # msgpack's empty bin: a refused stats blob in a spliced answer
_new_tuple = tuple.__new__  # a job's answer's Send without the NamedTuple's __new__ call


class DoneGathering:
    """The Done handlers of one :class:`~mpl.broker.state.BrokerState`: the tables they
    read are the state's own (never replaced), taken once here, not per Done."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state
        self.registry = state.registry
        self.access = state.access
        self.sessions = state.sessions
        self.jobs = state.calls.jobs
        self.counters = state.counters
        self.job_saves = state.job_saves
        self._note = state._note

    def on_done(
        self, peer: bytes, msg: Done, now: float, who: str | None = None, raw: Any = None
    ) -> list[Send]:
        """A Done the codec decoded (it had buffer frames or saved names)."""
        return self.decoded(peer, msg, who, raw, None, self.registry.worker(peer))

    def read(self, peer: bytes, read: DoneRead, now: float, who: str | None) -> list[Send]:
        """A Done of the hot path, read by ``mpl.wire.hot.read_done`` instead of decoded:
        the same checks as ``BrokerState.handle`` and :meth:`decoded` make (a registered
        worker's socket, then who speaks for the rank, then a job in flight that waits on
        that rank), with no record built; its values and stats go straight into the job's
        answer."""
        registry = self.registry  # registry.worker(peer), written out: a call per rank
        worker = registry.by_peer.get(peer) or registry.channels.get(peer)
        if worker is None:
            self._note("dropped 'done' from a peer that is not a registered worker")
            return []
        worker.last_seen = now
        rank = read.rank
        # access.speaks_for, written out for the answer it gives a worker's own rank (it
        # counts and notes anything else)
        if not (
            worker.rank == rank
            and registry.by_rank.get(rank) is worker
            and (who is None or self.access.node_rank.get(who) == rank)
        ):
            self.access.speaks_for(peer, who, rank, "done", worker)
            return []
        job = self.jobs.get(read.job)
        if job is None or rank not in job.pending or read.session != job.session:
            if job is None and self.job_saves.ended:  # (a hot Done saved nothing)
                self.job_saves.answered_late(read.session, read.job, rank)
            return []  # the job already ended (aborted); late answers are dropped
        job.pending.remove(rank)
        # plain msgpack: the answer is packed from the values, unless a decoded Done of
        # this job made it splice or encode (then it is encoded anew: no bytes of these)
        job.raw_values = None
        values = job.values
        for index, value in read.values.items():
            if index in values:
                values[index][rank] = value
            else:
                values[index] = {rank: value}
        job.stats[rank] = read.stats
        if read.metas:
            metas = job.metas
            for index, meta in read.metas.items():
                metas.setdefault(index, meta)
        if job.pending:
            return []
        return self.finish(job)

    def decoded(
        self,
        peer: bytes,
        msg: Done,
        who: str | None,
        raw: Any,
        spans: DoneSpans | None,
        worker: WorkerEntry | None,
    ) -> list[Send]:
        """Take one rank's decoded Done (``worker``: the registered worker ``peer`` is, if
        any): its values and stats go straight into the job's answer (a Done of the hot
        path takes :meth:`read` instead)."""
        rank = msg.rank
        if not self.access.speaks_for(peer, who, rank, "done", worker):
            return []
        job = self.jobs.get(msg.job)
        if job is None or rank not in job.pending or msg.session != job.session:
            if job is None:  # its files remain (and it answers for its rank: once)
                self.job_saves.late(msg)
            return []  # the job already ended (aborted); late answers are dropped
        job.pending.discard(rank)
        if msg.saved and (refused := self.job_saves.reported(job, msg)) is not None:
            return self.state._fail_call(job, refused)
        values, raw_values = job.values, job.raw_values
        job.lean = False  # it may hold what only the codec encodes (tuples, buffers)
        if raw_values is not None and spans is None and raw is not None:
            spans = done_spans(raw)  # a decoded Done: its bytes cut from its frames
            if spans is not None and spans.values.keys() != msg.values.keys():
                spans = None
        if raw_values is None or spans is None:
            job.raw_values = None  # packed, or encoded anew, at the end
            for index, value in msg.values.items():
                if index in values:
                    values[index][rank] = value
                else:
                    values[index] = {rank: value}
        else:
            # keep the bytes too, to forward them as they came; a value and its bytes
            # have the same index (cut from the same map), and so far every rank's had both
            value_bytes = spans.values
            for index, value in msg.values.items():
                if index in values:
                    values[index][rank] = value
                    raw_values[index][rank] = value_bytes[index]
                else:
                    values[index] = {rank: value}
                    raw_values[index] = {rank: value_bytes[index]}
            job.raw_stats[rank] = spans.stats
        job.stats[rank] = msg.stats  # a blob (an Opaque frame when 1 KiB or more): checked
        blob = stats_blob(msg.stats)
        if blob is None or len(blob) > MAX_STATS_BYTES:
            self._refuse_stats(job, rank, msg.stats, blob)
        if msg.metas:
            metas = job.metas
            for index, meta in msg.metas.items():
                metas.setdefault(index, meta)
        if job.pending:
            return []
        return self.finish(job)

    def _refuse_stats(self, job: JobCall, rank: int, stats: Any, blob: bytes | None) -> None:
        """A decoded Done whose stats are no blob, or one over MAX_STATS_BYTES (the lean
        reader leaves both to decode): the job's answer carries an empty blob for the rank
        instead (its reader says "stats unreadable"), and the result stands."""
        what = f"{len(blob)} bytes" if blob is not None else f"a {type(stats).__name__}"
        self.counters["stats_refused"] = self.counters.get("stats_refused", 0) + 1
        self._note(f"rank {rank} sent stats of {what} for job {job.job}; dropped")
        job.stats[rank] = b""
        if rank in job.raw_stats:
            job.raw_stats[rank] = _EMPTY_BIN

    def finish(self, job: JobCall) -> list[Send]:
        """Every rank of ``job`` answered: end it, and answer its driver."""
        if job.saved and (refused := self.job_saves.complete(job)) is not None:
            return self.state._fail_call(job, refused)
        job_id = job.job
        del self.jobs[job_id]
        session = self.sessions.by_id.get(job.session)  # _session_jobs_discard, written out
        if session is not None:
            session.jobs.discard(job_id)
        self.counters["jobs_done"] += 1
        # built, not checked again: the values, stats and metas were checked on reading
        result = result_record(job_id, job.values, job.stats, job.metas)
        frames = None
        if job.lean:  # every rank's Done read by read_done
            frames = packed_result(job_id, job.values, job.stats, job.metas)
        elif job.raw_values is not None:
            frames = result_frames(job_id, job.raw_values, job.raw_stats, job.metas)
        return [_new_tuple(Send, (job.driver, result, frames))]
