"""A worker learns who a session admits from the session's owner, never from the broker.

A hostile broker whose operator also holds a listed driver key (the broker "may be run by
one of" the parties) tries to read another driver's session values with that key: by a
forged ``Fetch`` naming its driver as ``reply_to``, by its driver's own sealed jobs run in
the other's session (reading its values as inputs), and after the session closed. Each is
refused here with ``SessionAccessError``: the worker binds a session to the driver whose
first sealed job claimed it, and to the drivers that owner's sealed word admits
(``mpl.worker.admission``, ``mpl.wire.session_word``).

The seals are pure classes: sealed Execs go straight from a driver's ``Sealer`` into a
``WorkerSeal``, as a broker would hand them on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import wait_until
from test_replay_restart import Rig, two_workers

import mpl.driver as mp
from mpl.wire import GraphBuilder
from mpl.wire.codec import decode, from_wire
from mpl.wire.data import Fetch
from mpl.wire.errors import AuthenticationError, SessionAccessError
from mpl.wire.jobs import Exec, Failed, output_uri
from mpl.wire.record import Record
from mpl.wire.seal import Sealer, exec_context, fetch_context
from mpl.wire.sessions import Reply, SessionClosed
from mpl.worker.sealing import WorkerSeal


def _sealers() -> tuple[Sealer, Sealer, Sealer]:
    """Drivers a and b, and node n0 whose spec lists both."""
    a, b, n = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    node_pub = {"node:n0": n[0].decode()}
    return (
        Sealer(a[1].decode(), "driver:a", node_pub),
        Sealer(b[1].decode(), "driver:b", node_pub),
        Sealer(n[1].decode(), "node:n0", {"driver:a": a[0].decode(), "driver:b": b[0].decode()}),
    )


_jobs = iter(range(1 << 40))


def _job(driver: Sealer, session: str, bindings: Any = None) -> tuple[Exec, Any]:
    """A new job of ``driver`` in ``session`` for rank 0: its Exec and its sealed bindings."""
    job = f"j{next(_jobs)}"
    context = exec_context(session, job, "d", (0,), (0,), 5.0)
    return Exec(session, job, "d", (0,), {}, (0,), 5.0), driver.seal(
        bindings, "node:n0", context, safe=False
    )


def _runs(worker: WorkerSeal, job: tuple[Exec, Any]) -> Any:
    """What the worker's job gets (its bindings, opened), or the ``Failed`` it answers."""
    msg, sealed = job
    return worker.open_exec(msg, msg.job, sealed)


def _fetched_by(worker: WorkerSeal, b: Sealer, session: str, uri: str) -> Any:
    """A fetch the broker forged: ``session``'s value ``uri`` for driver b, with a ticket
    it chose. What b reads of the worker's answer (None: nothing)."""
    forged = Fetch(session, 7, 0, uri, "driver:b", "chosen")
    assert worker.inbound(forged) == (forged, None)
    reply = worker.outbound(worker.reply(forged, "a's secret"))  # as the job shell answers it
    assert isinstance(reply, Reply)
    if reply.error is not None:
        assert reply.error.kind == "SessionAccessError", reply.error
        return None
    return b.open(reply.value, fetch_context(session, 0, uri, "chosen"), sender="node:n0")[1]


def test_a_forged_fetch_cannot_have_another_drivers_session_value_sealed_for_its_driver() -> None:
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    # driver a runs a job in its session "sa" here (its value "v" stays on the worker)
    assert _runs(worker, _job(a, "sa", [1])) == [1]
    assert _fetched_by(worker, b, "sa", "v") is None
    assert _fetched_by(worker, b, "unbound", "v") is None  # a session no job bound here


def test_another_listed_drivers_job_cannot_run_in_a_session_it_is_not_admitted_to() -> None:
    """Driver b's own jobs, sealed for a's session: one reading a's value as its input, and
    a sealed None of a stream b already ran here (the short path's kind of job)."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    assert _runs(worker, _job(a, "sa", [1])) == [1]
    assert _runs(worker, _job(a, "sa")) is None
    for _ in range(3):  # b's stream is known here: its next sealed None's head too
        assert _runs(worker, _job(b, "sb")) is None
    for job in (_job(b, "sa", ["v"]), _job(b, "sa"), _job(b, "sa")):
        refused = _runs(worker, job)
        assert type(refused) is Failed, refused
        assert refused.error.kind == "SessionAccessError" and "sa" in refused.error.message
        assert worker.recipient("sa", job[0].job) == ""  # nothing sealed for b
    assert _runs(worker, _job(a, "sa")) is None  # a's jobs still run
    assert _runs(worker, _job(b, "sb")) is None  # and b's in its own session


def test_a_reply_is_sealed_for_its_own_fetch_or_not_sent_at_all() -> None:
    """The job shell hands the seal the Fetch it read with the value that answers it: the
    value is sealed for that Fetch's driver and context, whatever other Fetch the broker
    sent with the same ``req`` (each reply is sealed for its own). A Reply with a value
    that did not come so (no Fetch to seal it for) goes as an error, never as the plain
    value; an error goes as it is."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    assert _runs(worker, _job(a, "sa", [1])) == [1]
    assert _runs(worker, _job(b, "sb", [1])) == [1]
    first = Fetch("sa", 7, 0, "v", "driver:a", "t")
    assert worker.inbound(first) == (first, None)
    second = Fetch("sb", 7, 0, "w", "driver:b", "t")
    assert worker.inbound(second) == (second, None)
    reply = worker.outbound(worker.reply(first, "a's secret"))
    assert isinstance(reply, Reply) and reply.error is None
    assert a.open(reply.value, fetch_context("sa", 0, "v", "t"), sender="node:n0")[1] == (
        "a's secret"
    )
    with pytest.raises(AuthenticationError):  # not for b, whose Fetch has the same req
        b.open(reply.value, fetch_context("sb", 0, "w", "t"), sender="node:n0")
    own = worker.outbound(worker.reply(second, "b's own"))
    assert isinstance(own, Reply) and own.error is None
    assert b.open(own.value, fetch_context("sb", 0, "w", "t"), sender="node:n0")[1] == "b's own"
    lost = worker.outbound(Reply(8, "a's secret"))  # no Fetch sealed it
    assert type(lost) is Reply
    assert lost.value is None and lost.error is not None
    assert lost.error.kind == "AuthenticationError" and lost.error.op == "fetch"
    assert worker.outbound(Reply(9, error=lost.error)) == Reply(9, error=lost.error)


def test_a_closed_sessions_binding_stays_a_replayed_job_stays_refused() -> None:
    """After the broker says a's session closed (its values are freed meanwhile), b's job
    cannot claim the session, nor can a's recorded job run again."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    recorded = _job(a, "sa", [1])
    assert _runs(worker, recorded) == [1]
    assert worker.inbound(SessionClosed("sa", "closed")) == (SessionClosed("sa", "closed"), None)
    for job in (_job(b, "sa"), _job(b, "sa", ["v"]), recorded):
        assert type(_runs(worker, job)) is Failed
    assert _fetched_by(worker, b, "sa", "v") is None


def test_the_bindings_are_bounded_and_a_session_not_closed_is_never_pushed_out() -> None:
    """Full: a new session is refused (never an open one's binding dropped: the next job
    could then claim it); a closed one's binding makes room, oldest closed first."""
    from mpl.worker.admission import SessionAdmission

    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    worker.admission = SessionAdmission(limit=3)  # the bound, made small
    worker._solo = worker.admission.solo
    for s in ("s0", "s1", "s2"):
        assert _runs(worker, _job(a, s)) is None
    full = _runs(worker, _job(b, "s3"))
    assert type(full) is Failed and full.error.kind == "SessionAccessError"
    assert "close sessions" in full.error.message
    assert all(type(_runs(worker, _job(b, s))) is Failed for s in ("s0", "s1", "s2"))
    for s in ("s2", "s1"):
        worker.inbound(SessionClosed(s, "closed"))
    assert _runs(worker, _job(b, "s3")) is None  # s2's binding went, s1's stays
    assert type(_runs(worker, _job(b, "s1"))) is Failed
    assert _runs(worker, _job(b, "s2")) is None  # s2 freed and closed: b may open one
    assert len(worker.admission) == 3
    assert _runs(worker, _job(a, "s0")) is None  # an open session stays bound


@pytest.mark.parametrize("first", ["owner", "sharee"])
def test_a_sharee_runs_only_where_the_owners_sealed_word_admits_it(first: str) -> None:
    """a shares "sa" with b (a grant in each job's bindings); b's jobs say they claim no say
    over who it admits. b's first job before a's word reached the worker is refused, saying
    so; after it, b runs and a value may be fetched for b; a's jobs without a word change
    no grant (they are refused under a grant admitting b); once a takes the sharing back
    (a later grant), b is refused again and a's jobs without a word run."""
    from mpl.wire.session_word import worded

    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    shared = ["driver:a", "driver:b"]
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    if first == "sharee":
        early = _runs(worker, _job(b, "sa", worded(None, None)))
        assert type(early) is Failed and early.error.kind == "SessionAccessError"
        assert "has not reached this worker" in early.error.message
    assert _runs(worker, _job(a, "sa", worded([1], shared, t + 1))) == [1]
    assert _runs(worker, _job(b, "sa", worded(["v"], None))) == ["v"]
    assert _fetched_by(worker, b, "sa", "v") == "a's secret"
    claim = _runs(worker, _job(b, "sa", worded(None, ["driver:b"], t + 9)))  # b claims it
    assert type(claim) is Failed and "belongs to another driver" in claim.error.message
    no_word = _runs(worker, _job(a, "sa"))  # no word: refused under a grant admitting b
    assert type(no_word) is Failed and no_word.error.kind == "SessionAccessError"
    assert _fetched_by(worker, b, "sa", "v") == "a's secret"
    assert _runs(worker, _job(a, "sa", worded(None, ["driver:a"], t + 2))) is None  # taken back
    assert _runs(worker, _job(a, "sa")) is None  # a alone again: a job without a word runs
    assert type(_runs(worker, _job(b, "sa", worded(None, None)))) is Failed
    assert _fetched_by(worker, b, "sa", "v") is None


# -- against real mpl-worker processes (CURVE), the broker tapped ----------------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster of two nodes whose spec lists drivers analyst, auditor and mallory
    (whose key the broker's operator holds)."""
    yield from two_workers(tmp_path, ("analyst", "auditor", "mallory"))


def recorded_replies(rig: Rig, *kinds: type[Record]) -> list[Any]:
    """The workers' messages of ``kinds`` (``Reply`` if none given) that reach the tapped
    broker, appended to the list returned as they come."""
    wanted = kinds or (Reply,)
    got: list[Any] = []
    receive = rig.tap.recv_multipart

    def recording(*args: Any, **kw: Any) -> Any:
        frames = receive(*args, **kw)
        with contextlib.suppress(Exception):
            msg = decode(from_wire([bytes(f) for f in frames[1:]]), unpickle=False)
            if isinstance(msg, wanted):
                got.append(msg)
        return frames

    rig.tap.recv_multipart = recording  # type: ignore[method-assign]
    return got


def _value_on(ctx: mp.Context, rank: int, value: Any) -> str:
    """The uri of ``value``, made on ``rank`` by a job of ``ctx``'s driver in its session."""
    b = GraphBuilder(2)
    g = b.build([b.op("constant", [], ranks=(rank,), value=value)[0]])
    return output_uri(ctx.client.submit(ctx.session, g, {}).job, 0)


def test_a_hostile_broker_cannot_fetch_an_owners_value_for_its_own_driver(rig: Rig) -> None:
    """mallory fetches a value of its own session; the broker sends the worker a Fetch of
    the analyst's value instead, for mallory's reply_to and ticket. The worker refuses it
    (on 2357d5f it sealed the analyst's value for mallory, who opened it)."""
    replies: list[Reply] = recorded_replies(rig)
    with rig.connect() as owner, rig.connect("mallory") as mallory:
        secret = _value_on(owner, 0, "the analyst's secret")
        decoy = _value_on(mallory, 0, "mallory's own")
        forged: list[Fetch] = []

        def forge(msg: Any) -> list[Any] | None:
            if isinstance(msg, Fetch) and msg.uri == decoy:
                forged.append(replace(msg, session=owner.session, uri=secret))
                return forged
            return None

        rig.tap.alter = forge
        with pytest.raises((SessionAccessError, AuthenticationError)):
            mallory.client.fetch(mallory.session, 0, decoy)
        rig.tap.alter = None
        (fetch,) = forged
        (reply,) = [r for r in replies if r.req == fetch.req]
        read = None
        if reply.error is None:
            read = mallory.client.seal.fetched(owner.session, 0, secret, fetch.ticket, reply.value)  # type: ignore[union-attr]
        assert read is None, f"mallory read {read!r}"
        assert reply.error is not None and reply.error.kind == "SessionAccessError"
        assert owner.client.fetch(owner.session, 0, secret) == "the analyst's secret"


def test_a_shared_session_serves_its_sharee_on_every_rank_and_no_one_else(rig: Rig) -> None:
    """The analyst opens a session shared with the auditor and runs a job on rank 0 alone:
    its word reached rank 1 too (the open told every rank), so the auditor's jobs run on
    both; mallory, whom the broker lets in, is refused by the workers."""
    with rig.connect(session="shared", share_with=["auditor"]) as owner:
        secret = _value_on(owner, 0, [4, 2])
        with rig.connect("auditor", session="shared") as auditor:
            assert auditor.client.fetch(auditor.session, 0, secret) == [4, 2]
            assert _value_on(auditor, 1, "audited") and _value_on(auditor, 0, "both")
        # the broker's operator lets mallory attach (the broker refuses it: the tap lies)
        b = GraphBuilder(2)
        x = b.input((0,))
        g = b.build([b.op("pcall", [x], ranks=(0,), fn=b.fn(len))[0]])
        with rig.connect("mallory") as mallory:
            seal = mallory.client.seal
            assert seal is not None
            mine = _value_on(mallory, 0, [1])
            mallory.client.submit(mallory.session, g, {0: [mine]})  # its program cached on P0
            stolen = seal.exec(
                Exec(owner.session, "stolen", g.digest, (0,), {0: [secret]}, (0,), 30.0)
            )

            def add(msg: Any) -> list[Any] | None:  # mallory's next Exec, the stolen one first
                if isinstance(msg, Exec) and msg.session == mallory.session:
                    rig.tap.alter = None
                    return [stolen, msg]
                return None

            rig.tap.alter = add
            mallory.client.submit(mallory.session, g, {0: [mine]})
            got = wait_until(
                lambda: [m for m in rig.tap.received if getattr(m, "job", "") == "stolen"],
                20,
                "the worker's answer to the stolen job",
            )
            assert [type(m) for m in got] == [Failed], got
            assert got[0].error.kind == "SessionAccessError"


def test_the_owners_binding_job_counts_only_if_every_live_worker_answered_it() -> None:
    """The job an owner runs as it opens a session (DriverSeal.word_job): a None on each
    rank whose worker the opening named, answered inline; an answer the broker withheld
    fails the open. A driver that attached to another's session runs none."""
    from test_sealed_replay import Cluster

    client = Cluster().client("a")
    told = client.word_job("s", 1, True)
    assert told is not None
    graph, inline = told
    assert graph.ranks == (0,) and inline == (0,)
    client.word_heard("s", graph, {0: {0: None}})
    with pytest.raises(AuthenticationError, match="rank 0 did not answer"):
        client.word_heard("s", graph, {0: {}})
    assert client.word_job("s", 1, False) is None
