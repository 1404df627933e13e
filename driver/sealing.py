"""The driver's end of end-to-end sealing (secure mode; see ``mpl.wire.seal``).

A job's program is sealed for every node of the driver's own spec, and each rank's
bindings for that rank alone, bound to (session, job, digest); results and fetch replies
open only if the node of the rank that answered sealed them for this driver, for exactly
that job and output, or that fetch's fresh ticket. The broker in between sees ciphertext.

Keys go by node name, never by the position of a node in the driver's copy of the spec:
that copy may list any subset of the broker's nodes in any order. Which rank is which node
is learnt from the session's layout (:meth:`DriverSeal.bind`). The layout comes through the
broker, but a broker that swapped two ranks would gain nothing: what is sealed for a node
opens only with that node's key, and a result from a rank opens only if that rank's node
sealed it, so a lie shows up as ``AuthenticationError``, never as a value in the wrong hands.

Who a session admits is the owner's word (``mpl.wire.session_word``): a client of the owner
that passed ``share_with`` seals its grant (the drivers it admits, stamped when it was
made) into every rank's bindings, other drivers say they claim no say, and the owner binds
the session to it on every live worker as it opens or re-attaches it
(:meth:`DriverSeal.word_job`). Workers check it and keep the newest grant
(``mpl.worker.admission``).

A worker that restarted, or joined after the session opened, refuses the first job sealed
for the process before it; the refusal names its incarnation, and the next job is sealed for
it. The refused job itself is sent once more only when it was sealed for no incarnation (a
worker that joined after the session opened), so it opened nowhere; after a restart its
error reaches the caller (:meth:`DriverSeal.refused` says why).
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

from mpl.wire.cluster import ClusterSpec
from mpl.wire.curve import Curve
from mpl.wire.errors import AuthenticationError
from mpl.wire.graph import Graph, GraphBuilder
from mpl.wire.identity import driver_identity, node_identity
from mpl.wire.incarnation import PUBLIC_INCARNATION_CHARS
from mpl.wire.jobs import Exec, JobResult, Program
from mpl.wire.record import pinned_fields
from mpl.wire.remote import ErrorInfo
from mpl.wire.replay import FLOOR_MAX, UNKNOWN_STREAM, WINDOW, claimed_stream, read_refusal
from mpl.wire.result_open import Opener, result_opener
from mpl.wire.safe_values import WORKER, pickles_allowed
from mpl.wire.seal import (
    ExecTails,
    Sealer,
    fetch_context,
    incarnation_suffix,
    pin_contexts,
    program_context,
)
from mpl.wire.session_word import grant_stamp, worded

__all__ = ["DriverSeal", "driver_seal"]

# DriverSeal sets a field of these records in place, in their __dict__ (a record that only
# stores its fields, direct): pinned here
_EXEC_FIELDS = pinned_fields(
    Exec,
    ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s"),
    "mpl.driver.sealing",
    direct=True,
)
_RESULT_FIELDS = pinned_fields(
    JobResult,
    ("job", "values", "error", "missing_program", "stats", "metas"),
    "mpl.driver.sealing",
    direct=True,
)

_OPENERS_KEPT = 16  # sessions whose result openers a client keeps (one each, made again)

# exec and result write out the contexts exec_context and done_context write
pin_contexts("mpl.driver.sealing")


def _with_word(
    word: tuple[list[str], int, bool] | None, plain: dict[int, Any], ranks: tuple[int, ...]
) -> dict[int, Any]:
    """Every rank's bindings in ``plain`` with a session's word (``mpl.wire.session_word``):
    ``word``, a grant (admitted, stamp, opening) or None (a member's). Not written in
    DriverSeal.sealed: a comprehension there would make its variables cells, ~530
    instructions more on every job (measured by callgrind)."""
    admits, granted, opening = word if word is not None else (None, 0, False)
    out = {}
    for rank in ranks:
        out[rank] = worded(plain.get(rank), admits, granted, opening)
    return out


def driver_seal(curve: Curve, trusted: bool) -> DriverSeal:
    sealer = Sealer.for_driver(curve)
    return DriverSeal(sealer, curve, trusted)


class DriverSeal:
    def __init__(self, sealer: Sealer | None, curve: Curve, trusted: bool) -> None:
        self.sealer = sealer
        # whether its sealed Nones are compact boxes (else records: Sealer.compact)
        self.compact = sealer is not None and sealer.compact
        self.safe = not pickles_allowed(WORKER, trusted=trusted)  # results: other parties
        spec = curve.cluster
        self._own = {n.name for n in spec.nodes} if spec else set()  # the nodes we hold keys of
        self._nodes: dict[int, str] = {}  # rank -> node identity, from the session's layout
        # rank -> the public incarnation of its worker, as last learnt (from the broker, or
        # the worker's refusal); and rank -> (node identity, what ends an Exec context for
        # that worker), for exec
        self._incarnations: dict[int, str] = {}
        self._targets: dict[int, tuple[str, str]] = {}
        self._nones: dict[int, tuple[str, bytes]] = {}  # _targets, its ends encoded
        self._tails = ExecTails()  # what exec_context writes after the job
        self.openers: dict[str, Opener] = {}  # session -> what opens its results
        # session -> this driver's word on who it admits, sealed into every rank's bindings
        # of its jobs (mpl.wire.session_word): its grant (the sorted drivers admitted, the
        # stamp of when it was made, whether the broker answered its open as a new
        # session), where this client owns the session and passed share_with (even []: a
        # grant taking a sharing back); None where it acts in it as
        # another's. No entry: it opened the session without share_with (no word: its
        # jobs' sealed Nones stay so)
        self.words: dict[str, tuple[list[str], int, bool] | None] = {}

    def speak_for(
        self, session: str, owns: bool, share_with: list[str] | None, opening: bool = False
    ) -> None:
        """What this driver's jobs in ``session`` say to the workers on who it admits
        (``words``): ``owns``, when it opened the session or set its ``share_with`` (the
        broker lets only the owner do either). With ``share_with`` (``[]`` too: taking a
        sharing back) a grant made now, stamped (``grant_stamp``), admitting the drivers
        named: every job restates it, so a worker the grant's own job missed learns it
        from the next, and a worker keeps the newest grant. Without, as it opened the
        session, no word (it admits this driver alone: a worker refuses its jobs once
        another client's grant admits others there, and so its open, given the id of a
        shared session). Otherwise nothing but that it acts in it, where its owner's word
        admits it. ``opening``: the broker answered this open as a new session (not
        attached): the grant says so, sealed, and a worker refuses it where it holds
        another binding of that id (the broker gave the open an old session's id)."""
        if self.sealer is None:  # it seals no job (exec says why)
            return
        if not owns:
            self.words[session] = None
        elif share_with is None:  # it opened the session (the broker's word: its lie
            self.words.pop(session, None)  # gains nothing, no word overrides a grant)
        else:
            me = self.sealer.identity
            admits = sorted({me, *(driver_identity(name) for name in share_with)})
            self.words[session] = (admits, grant_stamp(), opening)

    def bind(self, layout: ClusterSpec, incarnations: dict[int, str] | None = None) -> None:
        """Learn which rank is which node from a session's layout (the broker's ranks), and
        the public incarnation of each rank's worker (``SessionOpened.incarnations``).

        Only nodes of this driver's own spec get a rank here: the others have no key this
        driver trusts, so nothing is sealed for them. Every session of one broker has the
        same ranks; a layout that moves a known node to another rank, or puts it at a
        second one, is refused (a node's key is what pins its values to its rank). The
        incarnations are the broker's word: a wrong one only makes that worker refuse the
        next job, telling its own (:meth:`refused`).
        """
        ranks = {n.rank: node_identity(n.name) for n in layout.nodes if n.name in self._own}
        # a node at one rank only: its key is what pins a sealed value to its rank
        # (Done contexts name none), so one node at two ranks would read as either
        at = {who: rank for rank, who in self._nodes.items()}
        for rank, who in ranks.items():
            had = self._nodes.get(rank, who)
            if had != who or at.get(who, rank) != rank:
                where = f"{had}" if had != who else f"it at rank {at[who]}"
                raise AuthenticationError(
                    f"the broker puts {who} at rank {rank}, where an earlier session had "
                    f"{where}: a node's rank never changes on one broker"
                )
        for rank, who in ranks.items():
            self._nodes[rank] = who
            if rank not in self._targets:
                self._target_is(rank, who, "")
        for rank, incarnation in (incarnations or {}).items():
            self._learn(rank, incarnation, -1)

    def learn(self, rows: Any) -> None:
        """Learn the incarnations of the ranks' workers from the broker's status rows (a
        worker that joined after the session opened: its first job then runs). The
        broker's word, as in :meth:`bind`; anything malformed is passed over."""
        for row in rows if type(rows) is list else ():
            if type(row) is dict and type(row.get("rank")) is int and row.get("state") == "up":
                self._learn(row["rank"], row.get("incarnation"), -1)

    def _learn(self, rank: int, incarnation: Any, floor: int) -> None:
        """Seal for ``rank``'s worker as the process of public ``incarnation``, under a new
        epoch (its numbers start again, above ``floor``), if that is news."""
        who = self._nodes.get(rank)
        if (
            who is None
            or type(incarnation) is not str
            or len(incarnation) > PUBLIC_INCARNATION_CHARS
            or self._incarnations.get(rank, "") == incarnation
        ):
            return
        if self.sealer is not None:
            self.sealer.renew(who, 0, floor)  # a new worker knows no stream: start one
        self._incarnations[rank] = incarnation
        self._target_is(rank, who, incarnation)

    def _target_is(self, rank: int, who: str, incarnation: str) -> None:
        """Seal ``rank``'s bindings for ``who``'s worker process of public ``incarnation``."""
        suffix = incarnation_suffix(incarnation)
        self._targets[rank] = (who, suffix)
        self._nones[rank] = (who, suffix.encode())

    def word_job(
        self, session: str, world_size: int, owns: bool
    ) -> tuple[Graph, tuple[int, ...]] | None:
        """For the owner of ``session`` (``owns``), as it opens it or re-attaches it with
        ``share_with``: a job (graph, inline outputs) that binds the session to it on every
        live worker of a node of this driver's spec (one whose incarnation the session's
        opening named), with its word on who the session admits (so a new grant reaches
        them before ``mp.connect`` returns): a None made on each rank, answered inline, so
        each worker's sealed answer proves it admitted the job (``word_heard``). Then no
        other driver's job can claim the session on those workers first (before the
        owner's values reach one by a move, say), and a sharee's jobs run there (they are
        refused on a worker the owner's word has not reached). None: nothing to tell (not
        the owner, nothing sealed, no live worker)."""
        ranks = self._word_ranks()
        if not owns or self.sealer is None or not ranks:
            return None
        builder = GraphBuilder(world_size, "session word")
        made = [builder.op("constant", [], ranks=(r,), value=None)[0] for r in ranks]
        return builder.build(made), tuple(range(len(made)))

    def _word_ranks(self) -> list[int]:
        return sorted(r for r in self._nodes if self._incarnations.get(r))

    def word_heard(self, session: str, graph: Graph, values: dict[int, dict[int, Any]]) -> None:
        """Raise ``AuthenticationError`` unless every rank of ``session``'s :meth:`word_job`
        ``graph`` answered it (``values``: its opened inline results): each answer opened, so its
        worker admitted the job; one missing means the broker kept it from that worker."""
        for index, rank in enumerate(graph.ranks):  # (sorted, as word_job made them)
            if rank not in values.get(index, {}):
                raise AuthenticationError(
                    f"rank {rank} did not answer the job binding session {session} to this "
                    "driver: the broker kept it from that worker"
                )

    def _ready(self) -> Sealer:
        if self.sealer is None:
            raise AuthenticationError(
                "this driver cannot seal jobs for the workers: secure mode needs the cluster "
                "spec that pins the nodes' keys and lists this driver's key "
                "(mp.connect(url, key=..., cluster='cluster.yaml')), not the broker's key alone"
            )
        return self.sealer

    def _node(self, rank: int) -> str:
        who = self._nodes.get(rank)
        if who is None:
            raise AuthenticationError(
                f"rank {rank} is not a node of this driver's cluster spec: it holds no key "
                "to seal for it (name the node in the spec given to mp.connect)"
            )
        return who

    def _target(self, rank: int) -> tuple[str, str]:
        """What exec seals for ``rank`` with, when it has no entry: _node says why."""
        return self._node(rank), incarnation_suffix(self._incarnations.get(rank, ""))

    def program(self, graph: Graph) -> Program:
        sealer = self._ready()
        context = program_context(graph.digest)
        boxes = {
            rank: sealer.seal_record(graph, who, context, safe=False)
            for rank, who in self._nodes.items()
        }
        return Program(graph.digest, None, boxes)

    def exec(self, msg: Exec) -> Exec:
        """``msg`` with every rank's bindings sealed for that rank (:meth:`sealed`): ``msg``
        itself, its bindings field replaced (the dict it held is left as it was), so the
        caller sends it instead."""
        # the bindings sealed in their place: the caller built ``msg`` for this job and
        # sends what comes back instead (a field set so costs no record built: _EXEC_FIELDS)
        msg.__dict__["bindings"] = self.sealed(
            msg.session, msg.job, msg.digest, msg.ranks, msg.inline, msg.timeout_s, msg.bindings
        )
        return msg

    def sealed(
        self,
        session: str,
        job: str,
        digest: str,
        ranks: tuple[int, ...],
        inline: tuple[int, ...],
        timeout_s: float,
        plain: dict[int, Any],
    ) -> dict[int, Any]:
        """The bindings of the ``Exec`` of these fields, ``plain``, with every rank's sealed
        for that rank (a sealed None where it has none: it proves the job comes from this
        driver), as the ``Exec`` carries them: a call site packs them into its header
        without a record (``mpl.driver.job_site``). Each rank's bindings are sealed for its
        worker process: the context ends with that worker's incarnation (``_targets``)."""
        sealer = self.sealer or self._ready()
        # exec_context(...) without its call (checked on import): the job's, then per rank
        # its worker's incarnation
        context = f"exec|{job}{self._tails[(session, digest, ranks, inline, timeout_s)]}"
        sealed: dict[int, Any]
        words = self.words
        if words and session in words:  # a shared session's: each rank's carries the word
            plain = _with_word(words[session], plain, ranks)
        elif not plain:  # no rank has inputs (most jobs): every rank's None in one call
            try:  # (nones, written out: a Python call less)
                return sealer.seal_nones(self._nones, ranks, context.encode())
            except KeyError as exc:  # a rank of no node of this driver's spec
                self._target(exc.args[0])  # says why
                raise
        targets, seal, sealed = self._targets, sealer.seal, {}
        for rank in ranks:  # plain loops: a comprehension is one more call per job
            who, bound = targets.get(rank) or self._target(rank)
            # safe=False, passed by position: a keyword costs the call a name to match
            sealed[rank] = seal(plain.get(rank), who, context + bound, False)
        return sealed

    def exec_around(
        self,
        session: str,
        digest: str,
        ranks: tuple[int, ...],
        inline: tuple[int, ...],
        timeout_s: float,
    ) -> tuple[str, str]:
        """What the context of an ``Exec`` of these fields holds before its job id, and after
        it (up to each rank's own end): a call site writes them once, and each of its jobs'
        context as ``f"{before}{job}{after}"`` (as :meth:`sealed` writes it) for
        :meth:`nones`."""
        return "exec|", self._tails[(session, digest, ranks, inline, timeout_s)]

    def nones(self, context: bytes, ranks: tuple[int, ...]) -> dict[int, bytes]:
        """:meth:`sealed` for a job whose ranks have no inputs (a sealed None each), its
        context written out by the caller (:meth:`exec_around`) and encoded: only in a
        session whose jobs carry no word (not in ``words``), so while ``words`` is empty."""
        sealer = self.sealer or self._ready()
        try:
            return sealer.seal_nones(self._nones, ranks, context)
        except KeyError as exc:  # a rank of no node of this driver's spec
            self._target(exc.args[0])  # says why
            raise

    def result(self, session: str, result: JobResult) -> JobResult:
        """``result`` (decoded for this call) itself, its values field replaced by the
        values opened (:meth:`opened`)."""
        # the values opened in their place: the caller decoded ``result`` for this call and
        # keeps what comes back instead (a field set so costs no record built: _RESULT_FIELDS),
        # by the session's opener (opened, written out: a Python call less per job)
        opener = self.openers.get(session) or self.opener(session)
        result.__dict__["values"] = opener(result.job, result.values)
        return result

    def opened(
        self, session: str, job: str, sealed: dict[int, dict[int, Any]]
    ) -> dict[int, dict[int, Any]]:
        """The values of job ``job``'s result (``{output: {rank: sealed value}}``, as read
        from its JobResult) opened in place (``sealed`` itself comes back, each sealed value
        replaced by its value): each only if the node of its rank sealed it for this job and
        output. A caller holding the fields alone (a call site's compiled job)
        builds no record for it; one that answers many jobs calls the session's opener
        itself (``openers``, else :meth:`opener`): one Python call per answer."""
        return (self.openers.get(session) or self.opener(session))(job, sealed)

    def opener(self, session: str) -> Opener:
        """What opens the values of ``session``'s results (``mpl.wire.result_open``), kept
        in ``openers`` (the latest few sessions')."""
        openers = self.openers
        if len(openers) >= _OPENERS_KEPT:
            # (another thread may change it just now: then it stays a little over)
            with contextlib.suppress(StopIteration, RuntimeError):
                openers.pop(next(iter(openers)), None)
        made = openers[session] = result_opener(
            self._ready(), self._nodes, session, self.safe, self._node
        )
        return made

    def refused(self, error: ErrorInfo, sealed: dict[int, Any] | None = None) -> bool:
        """A job failed with ``error``. If its rank's worker refused the job's stream as one
        it does not know, seal for that node under a new epoch, and for the worker's
        incarnation the refusal names: the next job runs. A new epoch when the worker is
        another process (it restarted, or joined after the session opened: it cannot open
        what was sealed for another), when the current epoch started at or below the floor
        the refusal names (the worker forgot this stream, or streams of this driver started
        later), or when the epoch has numbered ``WINDOW`` Execs (an older worker's only
        refusal). The refusal comes through the broker: a forged one can only have this
        driver seal what the worker refuses, so its next job fails too, never what runs
        twice.

        Whether the job itself may be sent once more, sealed anew (``sealed``: its Exec's
        sealed bindings, every rank's): only when it can have run at no worker process. That
        holds when the job has the refusing rank alone (the broker answers at the first
        failure, so another rank may have run it), its payload carries the epoch sealing for
        that rank now (so it was sealed for the incarnation known before this refusal), and
        that incarnation was none (""): this driver knew no worker of that rank when it
        sealed the job (one that joined after the session opened). The context of a rank's
        bindings ends with the incarnation they were sealed for (``exec_context``), and a
        worker opens only what ends with its own (``mpl.worker.sealing``), which is never
        "": it is the public digest of a secret drawn at each process start
        (``mpl.wire.incarnation``, 16 hex digits). So a box sealed for "" opened nowhere,
        whatever the broker did with it; the one sent again is sealed for the incarnation
        the refusal names and runs at most once, in that process.

        A job sealed for a known incarnation is never sent again, though the refusal names
        another: the refusal is not sealed, and a hostile broker can deliver the job to the
        process it was sealed for, withhold the answer until that worker restarts (any
        restart), and forge the new process's refusal; sealing the job again for it would
        run it twice. Its error reaches the caller; the next job goes under the new epoch
        and incarnation, and runs. Nor is a job the process it was sealed for refused (a
        stream below the worker's floor, or past its first ``WINDOW`` numbers): that process
        opened it, and a stream it forgot may have run it."""
        if error.op != UNKNOWN_STREAM or error.kind != "AuthenticationError":
            return False
        rank = error.rank
        who = self._nodes.get(rank) if rank is not None else None
        if who is None or rank is None or self.sealer is None:
            return False
        incarnation, floor = read_refusal(error.message)
        floor = floor if floor < FLOOR_MAX else -1  # an epoch past it would not fit
        if incarnation is None or incarnation == self._incarnations.get(rank, ""):
            self.sealer.renew(who, WINDOW, floor)
            return False
        mine = sealed.get(rank) if sealed is not None and sealed.keys() == {rank} else None
        claimed = claimed_stream(mine) if mine is not None else None
        # sealed under the current epoch, so for the incarnation known until now: none
        nowhere = claimed is not None and claimed[1] == self.sealer.stream(who)
        nowhere = nowhere and rank not in self._incarnations
        self._learn(rank, incarnation, floor)
        return nowhere and self._incarnations.get(rank) == incarnation

    def may_send_again(self, ranks: tuple[int, ...]) -> bool:
        """Whether a job of ``ranks``, sealed now, may be sent once more should a worker
        refuse it (:meth:`refused`): only a job of one rank whose worker's incarnation this
        driver does not know (incarnations are learnt, never forgotten, so a job sealed for
        a known one is never sent again). A caller keeps the job's plaintext bindings only
        then."""
        return len(ranks) == 1 and ranks[0] not in self._incarnations

    def fetch_ticket(self) -> tuple[str, str]:
        """``(reply_to, ticket)`` for a new fetch."""
        return self._ready().identity, secrets.token_hex(12)

    def fetched(self, session: str, rank: int, uri: str, ticket: str, value: Any) -> Any:
        context = fetch_context(session, rank, uri, ticket)
        return self._ready().open(value, context, sender=self._node(rank), safe=self.safe)[1]
