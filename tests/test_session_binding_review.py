"""Review of w28-bind (sessions bound to their owner's sealed word): attacks a reviewer
found. Findings 1 to 6 are closed and their tests pass.

The attacker is the one the round's fix is for: a hostile broker whose operator also holds
a listed driver key (mallory). Real ``mpl-worker`` processes (CURVE) where a daemon is
concerned, the broker in this process behind the tap of ``test_replay_restart`` (or with
its session table made to lie); the pure seals where the attack is in ``WorkerSeal`` alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from test_replay_restart import Rig, two_workers
from test_session_driver_binding import (
    _fetched_by,
    _job,
    _runs,
    _sealers,
    _value_on,
    recorded_replies,
)

import mpl.driver as mp
from mpl.wire import GraphBuilder
from mpl.wire.data import Fetch
from mpl.wire.errors import AuthenticationError, SessionAccessError
from mpl.wire.jobs import Exec, Failed, output_uri
from mpl.wire.record import Record
from mpl.wire.session_word import worded
from mpl.wire.sessions import Ack, Reply, SaveSymbol, SessionOpened, SymbolInfo
from mpl.worker.sealing import WorkerSeal

pytestmark = pytest.mark.daemons


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster of two nodes whose spec lists drivers analyst and mallory (whose
    key the broker's operator holds)."""
    yield from two_workers(tmp_path, ("analyst", "mallory"))


def _fetched(ctx: mp.Context, rank: int, uri: str) -> Any:
    """What ``ctx``'s driver reads of ``uri`` in its session (None: refused, or none)."""
    try:
        return ctx.client.fetch(ctx.session, rank, uri)
    except mp.MplError:
        return None


def _read_by_mallory(
    mallory: mp.Context, replies: list[Any], fetch: Fetch, session: str, rank: int, uri: str
) -> Any:
    """What mallory reads of the worker's reply to its forged ``fetch`` (of ``uri`` in
    ``session`` on ``rank``), recorded in ``replies`` at the tapped broker: None if the
    worker refused it or sealed it for anyone else."""
    (reply,) = wait_until(
        lambda: [r for r in replies if isinstance(r, Reply) and r.req == fetch.req],
        20,
        "the forged fetch's reply",
    )
    if reply.error is not None:
        return None
    seal = mallory.client.seal
    assert seal is not None
    return seal.fetched(session, rank, uri, fetch.ticket, reply.value)


def _forged_fetch_read(
    rig: Rig,
    mallory: mp.Context,
    replies: list[Any],
    rank: int,
    decoy: str,
    session: str,
    uri: str,
) -> Any:
    """The broker turns mallory's next fetch of its own ``decoy`` on ``rank`` into a fetch
    of ``uri`` in ``session`` (mallory's reply_to and ticket kept): what mallory reads of
    the worker's reply (:func:`_read_by_mallory`; None: refused, or sealed for another)."""
    forged: list[Fetch] = []

    def forge(msg: Any) -> list[Any] | None:
        if isinstance(msg, Fetch) and msg.uri == decoy:
            rig.tap.alter = None
            forged.append(replace(msg, session=session, uri=uri))
            return forged
        return None

    rig.tap.alter = forge
    with contextlib.suppress(mp.MplError):  # its own fetch's answer: no matter
        mallory.client.fetch(mallory.session, rank, decoy)
    (fetch,) = forged
    return _read_by_mallory(mallory, replies, fetch, session, rank, uri)


def test_a_new_shared_session_given_a_private_sessions_id_does_not_admit_its_sharee_there(
    rig: Rig,
) -> None:
    """The analyst holds a value in a private session, then opens another session shared
    with mallory (an auditor of that one, say). The broker answers the open with the id of
    the private one: had the driver taken it, its open would tell every worker that the
    session of that id admits mallory, and mallory would fetch the private session's value.
    The driver chose the private session's id and asked for "collab": it refuses the answer
    (review w28-a finding 1 (a)), and mallory reads nothing."""
    with rig.connect() as private:
        secret = _value_on(private, 0, "the analyst's private value")

        def reuse(msg: Any) -> list[Any] | None:  # the shared open: the private session's id
            if isinstance(msg, SessionOpened):
                rig.tap.alter = None
                return [replace(msg, session=private.session)]
            return None

        rig.tap.alter = reuse
        with pytest.raises(AuthenticationError, match="not the one asked for"):
            rig.connect(session="collab", share_with=["mallory"])
        with rig.connect("mallory", session="collab") as mallory:
            read = _fetched(mallory, 0, secret)
        assert _fetched(private, 0, secret) == "the analyst's private value"
    assert read is None, f"mallory read the private session's value: {read!r}"


def test_an_owners_withheld_older_word_does_not_undo_its_later_one() -> None:
    """a shares "sa" with b, then takes the sharing back (it re-attaches with
    ``share_with=[]``: its jobs then carry its new grant, "a alone", stamped later). The
    broker kept back one of a's jobs sealed while b was admitted (that job failed for a: a
    timeout, a glitch) and hands it to the worker now: the replay window lets a number
    behind the newest run once (reordering). Had the admission taken its word as a's
    latest, b's jobs and fetches in "sa" would be admitted again, reading what a computed
    after it took the sharing back (review w28-a finding 2): the older grant loses."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    shared = ["driver:a", "driver:b"]
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    assert _runs(worker, _job(a, "sa", worded([1], shared, t + 1))) == [1]
    withheld = _job(a, "sa", worded(None, shared, t + 1))  # sealed, then kept back by the broker
    assert _runs(worker, _job(a, "sa", worded(None, ["driver:a"], t + 2))) is None  # a alone now
    refused = _runs(worker, _job(b, "sa", worded(None, None)))
    assert type(refused) is Failed and refused.error.kind == "SessionAccessError"
    assert _fetched_by(worker, b, "sa", "v") is None
    assert _runs(worker, withheld) is None  # a's old job runs (it never ran here)
    assert _fetched_by(worker, b, "sa", "v") is None, "b reads a's value again"
    assert type(_runs(worker, _job(b, "sa", worded(["v"], None)))) is Failed


def test_an_owners_withheld_older_job_does_not_share_the_session_again_on_a_worker(
    rig: Rig,
) -> None:
    """As above, against a real worker: the analyst's session is shared with mallory; the
    broker keeps back the analyst's next job on rank 0, then the analyst re-attaches with
    ``share_with=[]`` and makes a value on rank 0. The broker hands the kept job to the
    worker, then mallory's fetch of its own decoy rewritten into that value: the worker
    seals it for mallory."""
    replies: list[Reply] = recorded_replies(rig)
    with (
        rig.connect(session="collab", share_with=["mallory"]) as owner,
        rig.connect("mallory") as mallory,
    ):
        decoy = _value_on(mallory, 0, "mallory's own")
        kept: list[Exec] = []

        def keep(msg: Any) -> list[Any] | None:  # the analyst's next job on rank 0
            if isinstance(msg, Exec) and msg.session == owner.session and 0 in msg.bindings:
                rig.tap.alter = None
                kept.append(msg)
                return []
            return None

        rig.tap.alter = keep
        b = GraphBuilder(2)
        g = b.build([b.op("constant", [], ranks=(0,), value="early")[0]])
        owner.client.submit_async(owner.session, g, {})  # never answered: it is kept back
        wait_until(lambda: kept, 20, "the broker to keep the analyst's job back")
        with rig.connect(session="collab", share_with=[]) as again:  # the sharing taken back
            secret = _value_on(again, 0, "made after the sharing was taken back")
            forged: list[Fetch] = []

            def forge(msg: Any) -> list[Any] | None:
                if isinstance(msg, Fetch) and msg.uri == decoy:
                    rig.tap.alter = None
                    forged.append(replace(msg, session=owner.session, uri=secret))
                    return [kept[0], *forged]
                return None

            rig.tap.alter = forge
            with contextlib.suppress(SessionAccessError, AuthenticationError):
                mallory.client.fetch(mallory.session, 0, decoy)
            (fetch,) = forged
            read = _read_by_mallory(mallory, replies, fetch, owner.session, 0, secret)
            assert read is None, f"mallory read {read!r}"


def test_a_live_worker_the_broker_leaves_out_of_the_open_does_not_serve_the_owners_moves(
    rig: Rig,
) -> None:
    """Review finding 3 (closed by a move carrying its job's sealer, ``Move.sealer``): the
    driver binds its session on the workers the broker's ``SessionOpened`` lists:
    the broker leaves rank 1 out (live all along), so the analyst's open binds the session
    on rank 0 alone. The analyst's next job moves a value from rank 0 to rank 1; the broker
    hands rank 1 mallory's sealed Exec of the same session, job and program instead of the
    analyst's: it binds the session there to mallory. The move of the analyst's job must not
    reach mallory's job (it did before moves named their sealer: the worker then sealed the
    analyst's value for mallory's fetch); mallory's job fails at its deadline instead."""
    replies: list[Reply] = recorded_replies(rig)
    with rig.connect("mallory") as mallory:
        decoy = _value_on(mallory, 1, "mallory's own")
        seal = mallory.client.seal
        assert seal is not None

        def leave_out(msg: Any) -> list[Any] | None:  # rank 1 not live, says the broker
            if isinstance(msg, SessionOpened):
                rig.tap.alter = None
                live = {r: i for r, i in msg.incarnations.items() if r != 1}
                return [replace(msg, incarnations=live)]
            return None

        rig.tap.alter = leave_out
        with rig.connect() as owner:
            stolen: list[Exec] = []

            def swap(msg: Any) -> list[Any] | None:  # the analyst's job on rank 1: mallory's
                if isinstance(msg, Exec) and msg.session == owner.session and 1 in msg.bindings:
                    rig.tap.alter = None
                    # (a short deadline: a job that never gets its move fails soon)
                    plain = Exec(msg.session, msg.job, msg.digest, msg.ranks, {}, msg.inline, 2.0)
                    boxes = seal.exec(plain).bindings
                    stolen.append(replace(msg, bindings={1: boxes[1]}, timeout_s=2.0))
                    return stolen
                return None

            rig.tap.alter = swap
            b = GraphBuilder(2)
            x = b.op("constant", [], ranks=(0,), value="the analyst's value on P0")[0]
            y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
            with contextlib.suppress(mp.MplError):  # (what the analyst sees does not matter)
                owner.client.submit(owner.session, b.build([y]), {})
            (job,) = [m.job for m in stolen]
            secret = output_uri(job, 0)
            read = _forged_fetch_read(rig, mallory, replies, 1, decoy, owner.session, secret)
            assert read is None, f"mallory read {read!r}"


def test_a_forged_save_cannot_carry_another_drivers_value_out_of_its_session(rig: Rig) -> None:
    """The round's checks guard a session's values by who the session admits. But a
    ``SaveSymbol`` (unsealed, the broker's word) made the worker persist a value of the
    analyst's session on its disk, and a persisted name read from any session: the broker
    sends one for the analyst's value, then turns mallory's fetch in mallory's own session
    into a fetch of ``sym:<that name>``. On 0f5e5cc the worker sealed the analyst's value
    for mallory; now it refuses the save (a secure worker saves only by a sealed job), and
    would refuse the fetch anyway (a persisted value reads only in its owner's sessions)."""
    got: list[Record] = recorded_replies(rig, Reply, Ack)
    with rig.connect() as owner, rig.connect("mallory") as mallory:
        secret = _value_on(owner, 0, "the analyst's secret")
        decoy = _value_on(mallory, 0, "mallory's own")
        save = SaveSymbol(owner.session, 424242, secret, SymbolInfo("loot", "P0", (0,), True, {}))

        def persist(msg: Any) -> list[Any] | None:  # first: the analyst's value, persisted
            if isinstance(msg, Fetch) and msg.uri == decoy:
                rig.tap.alter = None
                return [save, msg]
            return None

        rig.tap.alter = persist
        assert mallory.client.fetch(mallory.session, 0, decoy) == "mallory's own"
        (ack,) = wait_until(
            lambda: [m for m in got if isinstance(m, Ack) and m.req == save.req], 20, "the ack"
        )
        assert ack.error is not None and (ack.error.kind, ack.error.rank, ack.error.op) == (
            "AuthenticationError",
            0,
            "save",
        ), ack.error
        # then: mallory's fetch of that name, in its own session
        read = _forged_fetch_read(rig, mallory, got, 0, decoy, mallory.session, "sym:loot")
        assert read is None, f"mallory read {read!r}"


def test_sessions_closed_by_a_broker_restart_do_not_fill_a_workers_bindings(
    tmp_path: Path,
) -> None:
    """A worker closes every session it holds values of when a new broker welcomes it
    (``WorkerJobs.close_all``), but not through ``WorkerSeal.inbound``: its bindings stay
    as open sessions', which are never evicted. Sessions open at each broker restart (and
    any with no value here) so add up until the worker refuses every new session. The
    bound (20,000) is made 1 here, as ``test_the_bindings_are_bounded...`` makes it 3."""
    from test_sealed_broker import Setup

    from mpl.broker.daemon import Broker
    from mpl.worker.admission import SessionAdmission

    setup = Setup(tmp_path, secure=True)
    try:
        setup.ctx.close()  # (its session closed by the broker: evictable)
        for w in setup.workers:
            assert w.seal is not None
            w.seal.admission = SessionAdmission(limit=1)
            w.seal._solo = w.seal.admission.solo
        before = setup.ctx = mp.connect(
            setup.broker.address, key=setup.driver_key, cluster=setup.spec, timeout=20
        )
        for rank in (0, 1):
            _value_on(before, rank, "held")
        address, old = setup.broker.address, setup.broker
        old.stop()
        old.join(5)
        setup.broker = Broker(setup.spec, address, curve=setup.curves["broker"])
        setup.broker.start()
        fresh = setup.broker.state.broker_id
        wait_until(
            lambda: all(w.state.broker_id == fresh for w in setup.workers), 30, "the re-join"
        )
        wait_until(  # what the restart closed on each worker: the session's values
            lambda: all(not w.store.session_ids() for w in setup.workers), 30, "the close"
        )
        with contextlib.suppress(mp.MplError):
            before.close()
        setup.ctx = mp.connect(address, key=setup.driver_key, cluster=setup.spec, timeout=20)
        assert _value_on(setup.ctx, 0, "after") is not None
    finally:
        setup.close()


def test_a_fetch_reply_whose_record_the_broker_displaced_is_never_sent_unsealed(
    rig: Rig, tmp_path: Path
) -> None:
    """The worker keeps each Fetch by its ``req`` (the broker's number) to seal the reply
    for, and sends a Reply it finds no Fetch for as it is. The broker sends a Fetch of the
    output of the analyst's running job (it waits behind the job) and another Fetch with
    the same ``req`` of a value already held (answered at once: it takes the record).
    When the job ends, the first reply goes to the broker in plaintext. No driver key is
    needed; 4,096 other fetches in between would do the same (the records' LRU)."""
    replies: list[Reply] = recorded_replies(rig)
    flag = str(tmp_path / "go")

    def slow() -> str:  # the analyst's job: it ends once the test says so
        import os
        import time

        end = time.monotonic() + 30
        while not os.path.exists(flag) and time.monotonic() < end:
            time.sleep(0.01)
        return "the analyst's secret"

    req = 987654
    with rig.connect() as owner:
        held = _value_on(owner, 0, "held")
        b = GraphBuilder(2)
        g = b.build([b.op("pcall", [], ranks=(0,), fn=b.fn(slow))[0]])
        sent: list[Fetch] = []

        def fetches(msg: Any) -> list[Any] | None:  # after the job: two fetches of one req
            if isinstance(msg, Exec) and msg.session == owner.session and 0 in msg.bindings:
                rig.tap.alter = None
                waits = Fetch(owner.session, req, 0, output_uri(msg.job, 0), "driver:x", "t")
                # the same req for the held value, then another req: the worker takes
                # messages in order, so the last one's reply says the second was handled
                sent.extend(
                    [waits, replace(waits, uri=held), replace(waits, req=req + 1, uri=held)]
                )
                return [msg, *sent]
            return None

        rig.tap.alter = fetches
        future = owner.client.submit_async(owner.session, g, {})
        wait_until(lambda: [r for r in replies if r.req == req + 1], 20, "the later fetch's reply")
        after = len(replies)
        Path(flag).write_text("go")
        assert future.result(30) is not None
        got = wait_until(
            lambda: [r for r in replies[after:] if r.req == req], 20, "the job's output's reply"
        )
        plain = [r.value for r in got if r.value == "the analyst's secret"]
        assert not plain, "the worker sent the analyst's value to the broker unsealed"


def test_an_owners_other_client_does_not_share_again_what_the_owner_took_back(
    rig: Rig,
) -> None:
    """Finding 2 without a message kept back: the analyst's first client opened the session
    shared with mallory and keeps its word; the analyst takes the sharing back from a second
    client (``share_with=[]``), which the broker honours. The first client's next job, in
    good faith, carries its old word: every worker it runs on admits mallory again, and the
    broker's operator fetches the second client's value for mallory."""
    replies: list[Reply] = recorded_replies(rig)
    with (
        rig.connect(session="collab", share_with=["mallory"]) as first,
        rig.connect("mallory") as mallory,
    ):
        decoy = _value_on(mallory, 0, "mallory's own")
        with rig.connect(session="collab", share_with=[]) as second:  # the sharing taken back
            secret = _value_on(second, 0, "made after the sharing was taken back")
            _value_on(first, 0, "the first client's next job")
            read = _forged_fetch_read(rig, mallory, replies, 0, decoy, first.session, secret)
            assert read is None, f"mallory read {read!r}"


def test_a_driver_reattaching_its_own_session_is_not_put_in_another_drivers_session(
    rig: Rig,
) -> None:
    """Finding 1 from the other side: the victim need share nothing. mallory opens a
    session shared with the analyst. The analyst re-attaches to its own session "p" from a
    second client (no ``share_with``: it acts as a member, as the README says); the broker
    answers with the id of mallory's session. The analyst's jobs run there (mallory's word
    admits it) and their values are mallory's: mallory fetches them, through the honest
    broker's own checks, with no forged message but the one ``SessionOpened``. A named
    session's id carries its name: the driver refuses an answer naming another (review w28-a
    finding 1 (b)), and acts in "p" once the broker answers honestly."""
    with (
        rig.connect("mallory", session="trap", share_with=["analyst"]) as mallory,
        rig.connect(session="p"),
    ):

        def redirect(msg: Any) -> list[Any] | None:  # the analyst's re-attach: into the trap
            if isinstance(msg, SessionOpened) and msg.attached:
                rig.tap.alter = None
                return [replace(msg, session=mallory.session)]
            return None

        rig.tap.alter = redirect
        with pytest.raises(AuthenticationError, match="not the one asked for"):
            rig.connect(session="p")
        lied: Any = rig.tap.alter  # (None once the broker did lie)
        assert lied is None
        with rig.connect(session="p") as again:
            assert again.session.startswith("p~")
            made = _value_on(again, 0, "the analyst's input, in its own session")
            read = _fetched(mallory, 0, made)
    assert read is None, f"mallory read {read!r}"


def test_a_fresh_private_session_is_not_put_in_another_drivers_session(rig: Rig) -> None:
    """Finding 1 (b) for the default ``mp.connect`` (no name, no ``share_with``): the broker
    answers the open with ``attached`` and the id of mallory's session shared with the
    analyst. The driver takes it for another's session it may act in (``owns`` False: no
    binding job, no word but "a member"), and its values are mallory's. The driver names
    its fresh session itself: it refuses an answer naming another, or saying its fresh one
    already existed (review w28-a finding 1 (c))."""
    with rig.connect("mallory", session="trap", share_with=["analyst"]) as mallory:
        for lie in ({"session": mallory.session}, {}):  # mallory's session; its own, attached

            def redirect(msg: Any, lie: dict[str, Any] = lie) -> list[Any] | None:
                if isinstance(msg, SessionOpened):
                    rig.tap.alter = None
                    return [replace(msg, attached=True, **lie)]
                return None

            rig.tap.alter = redirect
            with pytest.raises(AuthenticationError, match="not the one asked for"):
                rig.connect()
            assert rig.tap.alter is None  # the broker did lie
        with rig.connect() as private:
            made = _value_on(private, 0, "the analyst's private input")
            read = _fetched(mallory, 0, made)
    assert read is None, f"mallory read {read!r}"
