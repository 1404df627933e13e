"""Names saved inside a job (``save`` ops of ``@mp.function`` programs), learnt from the
workers' ``Done``.

The broker may not see a program's ops (secure mode seals them for the workers), and a
driver's word is no proof that anything was written. So the only source is each worker's
``Done.saved``: what that rank's own save ops wrote, each rank speaking for itself only.

* A persisted name is that party's own entry: it is recorded for the reporting rank as soon
  as its ``Done`` arrives (the file is on its disk, whatever the other ranks do next), even
  when the job has already failed elsewhere. Its owner (whom a secure broker lists it to)
  is the authenticated driver that sent the job. A ``Done`` arriving after its job ended
  (failed on another rank, cancelled, timed out) is matched to what the broker kept of
  that job as it ended (by its session and id: its driver, ranks and the ranks it still
  waited for; at most ``ENDED_JOBS_KEPT`` jobs that ended with ranks still to answer, each
  driver its share: ``broker/ended_jobs.py``):
  the first late Done of a rank it waited for saves for that driver, as that Done would
  have while the job ran. Any other (a rank that had answered, or failed the job, or a
  second late Done) names no owner, nor does one of a job the broker no longer knows: its
  entry is listed to no one (nor loaded or deleted by its owner through the broker) until
  the worker's next hello says whose the file is; the owner saving it again also settles
  it. A job's entry goes when every rank it waited for has answered.
* A session name becomes a name of the session when the job completes and every rank the
  value spans reported the same value (device and ranks) under it. A name one rank claims
  for others, or that the ranks disagree on, is dropped and counted as forged.
* Bounds: at most ``MAX_JOB_SAVES`` names per rank and job, each a valid name (which also
  bounds its length), each rank reporting only for a value it holds among the job's ranks;
  session names are subject to the same ``MAX_SESSION_SYMBOLS`` as ``SaveSymbol``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpl.broker.admission import refuse_save
from mpl.broker.calls import JobCall
from mpl.broker.ended_jobs import ENDED_JOBS_KEPT, EndedJobs
from mpl.wire.jobs import Done
from mpl.wire.limits import MAX_JOB_SAVES, MAX_SESSION_SYMBOLS, valid_name
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import SymbolInfo

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["ENDED_JOBS_KEPT", "JobSaves"]

_META_CHARS = 256  # a description ("float64[3, 2]") the broker keeps per name, at most


class JobSaves:
    """The save bookkeeping of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state
        # (session, job id) -> (the driver that sent it, its ranks, the ranks it still
        # waits for), for jobs that ended before every rank answered. Keyed by the session
        # too: a job of another session given the same id (a driver chooses its ids) takes
        # no other's entry; one driver's failures push out its own entries first
        self.ended = EndedJobs(ENDED_JOBS_KEPT)

    def ending(self, job: JobCall, failed: int | None = None) -> None:
        """``job`` ends now (``failed``: the rank whose Failed ended it, which answered):
        if a rank has yet to answer, keep whose it was, for the saves its late Done
        reports."""
        waiting = job.pending - {failed} if failed is not None else set(job.pending)
        if waiting:
            self.ended[(job.session, job.job)] = (job.sender, job.ranks, waiting)

    def answered_late(self, session: str, job: str, rank: int) -> tuple[str, tuple[int, ...]]:
        """Rank ``rank`` (authenticated) answers ``job`` of ``session`` after it ended: the
        job's driver and ranks if the job still waited for that rank (which now has
        answered: once only), else ("", ()). An entry whose every rank answered goes."""
        key = (session, job)
        ended = self.ended.get(key)
        if ended is None or rank not in ended[2]:
            return "", ()
        driver, ranks, waiting = ended
        waiting.discard(rank)
        if not waiting:
            del self.ended[key]
        return driver, ranks

    def reported(self, job: JobCall, msg: Done) -> ErrorInfo | None:
        """Take what rank ``msg.rank`` (already authenticated) says it saved; an error
        fails the job (a worker over the bound)."""
        if len(msg.saved) > MAX_JOB_SAVES:
            self.state.counters["protocol_errors"] += 1
            return ErrorInfo(
                "ProtocolError",
                f"rank {msg.rank} reported {len(msg.saved)} saved names in job {job.job}, "
                f"more than MAX_JOB_SAVES ({MAX_JOB_SAVES})",
                rank=msg.rank,
                job=job.job,
            )
        for claimed in msg.saved:
            info = self._plausible(job.job, job.ranks, msg.rank, claimed)
            if info is None:
                continue
            if info.persist:
                # its own entry only, owned by the driver that sent the job (who sealed it,
                # which the worker wrote into the file)
                self.state.persisted.saved(info, (msg.rank,), job.sender)
            else:
                job.saved.setdefault(info.name, {})[msg.rank] = info
        return None

    def late(self, msg: Done) -> None:
        """A ``Done`` for a job that already ended (failed, cancelled, a rank lost): its
        session names are void, but the files its rank persisted are on that rank's disk,
        and the rank speaks for its own disk as in its hello. Every late Done (saves or
        none) is its rank's answer: the ended job waits for that rank no more."""
        owner, ranks = self.answered_late(msg.session, msg.job, msg.rank)
        if not msg.saved:
            return
        if len(msg.saved) > MAX_JOB_SAVES:
            self.state.counters["protocol_errors"] += 1
            return
        if not owner:  # whose job it was is forgotten, or this was no answer it waited for
            ranks = tuple(range(self.state.cluster.world_size))
        for claimed in msg.saved:
            if claimed.persist:
                info = self._plausible(msg.job, ranks, msg.rank, claimed)
                if info is not None:  # (owner "": whose job it was is forgotten: listed
                    self.state.persisted.saved(info, (msg.rank,), owner)  # to no one)

    def complete(self, job: JobCall) -> ErrorInfo | None:
        """The job's last rank is done: name in the session what every holder reported."""
        session = self.state.sessions.get(job.session)
        if session is None:
            return None
        accepted: dict[str, SymbolInfo] = {}
        for name, reports in job.saved.items():
            info = next(iter(reports.values()))
            agreed = all((r.device, r.ranks) == (info.device, info.ranks) for r in reports.values())
            if not agreed or set(reports) != set(info.ranks):
                self.state.access.forged(
                    f"the save of {name!r} in job {job.job}: reported by rank(s) "
                    f"{sorted(reports)} for a value on {list(info.ranks)}"
                )
                continue
            if (refusal := refuse_save(info, session.symbols)) is not None:
                return ErrorInfo("ProtocolError", refusal, job=job.job, op=f"save {name!r}")
            accepted[name] = info
        new = len(accepted.keys() - session.symbols.keys())
        if new and len(session.symbols) + new > MAX_SESSION_SYMBOLS:  # all the job's or none
            return ErrorInfo(
                "ProtocolError",
                f"the job saves {new} new names; the session holds {len(session.symbols)} of "
                f"at most {MAX_SESSION_SYMBOLS}: delete some",
                job=job.job,
            )
        session.symbols.update(accepted)
        return None

    def _plausible(
        self, job: str, job_ranks: tuple[int, ...], rank: int, info: SymbolInfo
    ) -> SymbolInfo | None:
        """``info`` as the broker keeps it, or None (dropped, counted) when rank ``rank``
        could not have written it in a job over ``job_ranks``."""
        ranks = info.ranks
        if (
            not valid_name(info.name)
            or rank not in ranks
            or not set(ranks) <= set(job_ranks)
            or list(ranks) != sorted(set(ranks))
        ):
            self.state.access.forged(f"a saved name {info.name!r:.80} from rank {rank} ({job})")
            return None
        meta = str(info.meta.get("meta", ""))[:_META_CHARS]
        return SymbolInfo(info.name, info.device[:_META_CHARS], ranks, info.persist, {"meta": meta})
