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
"""

from __future__ import annotations

import secrets
from typing import Any

from mpl.wire.cluster import ClusterSpec
from mpl.wire.curve import Curve
from mpl.wire.errors import AuthenticationError
from mpl.wire.graph import Graph
from mpl.wire.identity import node_identity
from mpl.wire.jobs import Exec, JobResult, Program
from mpl.wire.record import pinned_fields
from mpl.wire.remote import ErrorInfo
from mpl.wire.replay import UNKNOWN_STREAM, WINDOW
from mpl.wire.safe_values import WORKER, pickles_allowed
from mpl.wire.seal import (
    ExecTails,
    Sealer,
    fetch_context,
    pin_contexts,
    program_context,
)

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

# exec and result write out the contexts exec_context and done_context write
pin_contexts("mpl.driver.sealing")


def driver_seal(curve: Curve, trusted: bool) -> DriverSeal:
    sealer = Sealer.for_driver(curve)
    return DriverSeal(sealer, curve, trusted)


class DriverSeal:
    def __init__(self, sealer: Sealer | None, curve: Curve, trusted: bool) -> None:
        self.sealer = sealer
        self.safe = not pickles_allowed(WORKER, trusted=trusted)  # results: other parties
        spec = curve.cluster
        self._own = {n.name for n in spec.nodes} if spec else set()  # the nodes we hold keys of
        self._nodes: dict[int, str] = {}  # rank -> node identity, from the session's layout
        # rank -> (node identity, what ends an Exec context for it), for Sealer.seal_nones
        self._targets: dict[int, tuple[str, str]] = {}
        self._tails = ExecTails()  # what exec_context writes after the job

    def bind(self, layout: ClusterSpec) -> None:
        """Learn which rank is which node from a session's layout (the broker's ranks).

        Only nodes of this driver's own spec get a rank here: the others have no key this
        driver trusts, so nothing is sealed for them. Every session of one broker has the
        same ranks; a layout that moves a known node to another rank is refused.
        """
        ranks = {n.rank: node_identity(n.name) for n in layout.nodes if n.name in self._own}
        for rank, who in ranks.items():
            if self._nodes.setdefault(rank, who) != who:
                raise AuthenticationError(
                    f"the broker puts {who} at rank {rank}, where an earlier session had "
                    f"{self._nodes[rank]}: a node's rank never changes on one broker"
                )
            self._targets.setdefault(rank, (who, ""))

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

    def program(self, graph: Graph) -> Program:
        sealer = self._ready()
        context = program_context(graph.digest)
        boxes = {
            rank: sealer.seal_record(graph, who, context, safe=False)
            for rank, who in self._nodes.items()
        }
        return Program(graph.digest, None, boxes)

    def exec(self, msg: Exec) -> Exec:
        """``msg`` with every rank's bindings sealed for that rank (a sealed None where it
        has none: it proves the job comes from this driver): ``msg`` itself, its bindings
        field replaced (the dict it held is left as it was), so the caller sends it instead."""
        sealer = self.sealer or self._ready()
        # exec_context(...) without its call (checked on import)
        tail = self._tails[(msg.digest, msg.ranks, msg.inline, msg.timeout_s)]
        context = f"exec|{msg.session}|{msg.job}{tail}"
        plain, nodes = msg.bindings, self._nodes
        sealed: dict[int, Any]
        if not plain:  # no rank has inputs (most jobs): every rank's None in one call
            try:
                sealed = sealer.seal_nones(self._targets, msg.ranks, context)
            except KeyError as exc:  # a rank of no node of this driver's spec
                self._node(exc.args[0])  # says why
                raise
        else:
            seal, sealed = sealer.seal, {}
            for rank in msg.ranks:  # plain loops: a comprehension is one more call per job
                who = nodes.get(rank) or self._node(rank)  # _node says why there is none
                # safe=False, passed by position: a keyword costs the call a name to match
                sealed[rank] = seal(plain.get(rank), who, context, False)
        # the bindings sealed in their place: the caller built ``msg`` for this job and
        # sends what comes back instead (a field set so costs no record built: _EXEC_FIELDS)
        msg.__dict__["bindings"] = sealed
        return msg

    def result(self, session: str, result: JobResult) -> JobResult:
        """``result`` (decoded for this call) itself, its values field replaced by the
        values opened: each only if the node of its rank sealed it for this job and output."""
        open_all, safe, nodes = (self.sealer or self._ready()).open_all, self.safe, self._nodes
        values: dict[int, dict[int, Any]] = {}
        for index, per_rank in result.values.items():
            try:  # every rank's value of this output in one call; done_context written out
                values[index] = open_all(
                    per_rank, nodes, f"done|{session}|{result.job}|{index}", safe
                )
            except KeyError as exc:  # a rank of no node of this driver's spec
                self._node(exc.args[0])  # says why
                raise
        # the values opened in their place: the caller decoded ``result`` for this call and
        # keeps what comes back instead (a field set so costs no record built: _RESULT_FIELDS)
        result.__dict__["values"] = values
        return result

    def refused(self, error: ErrorInfo) -> None:
        """A job failed with ``error``. If its rank's worker refused the job's stream as one
        it does not know (it restarted, or forgot this client), seal for that node under a
        new epoch: the next job runs. Only once the epoch has numbered ``WINDOW`` Execs for
        it, as a genuine refusal needs: a broker forging refusals cannot make this driver
        start new streams faster than one per ``WINDOW`` jobs."""
        if error.op != UNKNOWN_STREAM or error.kind != "AuthenticationError":
            return
        who = self._nodes.get(error.rank) if error.rank is not None else None
        if who is not None and self.sealer is not None:
            self.sealer.renew(who, WINDOW)

    def fetch_ticket(self) -> tuple[str, str]:
        """``(reply_to, ticket)`` for a new fetch."""
        return self._ready().identity, secrets.token_hex(12)

    def fetched(self, session: str, rank: int, uri: str, ticket: str, value: Any) -> Any:
        context = fetch_context(session, rank, uri, ticket)
        return self._ready().open(value, context, sender=self._node(rank), safe=self.safe)[1]
