"""Review w29-a: a session's stamped grants (``mpl.worker.admission``) against a hostile
broker whose operator holds a listed driver key (driver b, "mallory"), and what a grant
lets a driver read of the owner's persisted values (``mpl.worker.symbol_owner``).

Findings 1, 2 and 3 are closed and their tests pass (finding 3 by a session id that
names its owner, ``mpl.wire.session_word.session_id``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from test_replay_restart import Rig, two_workers
from test_session_binding_review import _forged_fetch_read
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
from mpl.wire.errors import AuthenticationError, SessionAccessError
from mpl.wire.jobs import Exec, Failed
from mpl.wire.seal import Sealer
from mpl.wire.session_word import binds_owner, session_id, worded
from mpl.wire.sessions import Reply, SessionClosed, SessionOpened, SymbolInfo
from mpl.worker.admission import SessionAdmission
from mpl.worker.sealing import WorkerSeal
from mpl.worker.store import ObjectStore
from mpl.worker.symbol_disk import SymbolDisk

SHARED = ["driver:a", "driver:b"]
ALONE = ["driver:a"]
PROJ = "proj~0123456789abcdef"  # a session a named "proj" (its id: name and a tail)


def _refused(got: object) -> bool:
    return type(got) is Failed and got.error.kind == "SessionAccessError"


def test_a_private_reopen_given_an_old_shared_sessions_id_admits_no_sharee() -> None:
    """a once opened "proj" sharing it with b (a grant, stamp 1), and closed it. Later a
    opens "proj" again, without share_with: a private session. The broker (b's operator)
    answers the open with the old session's id (it draws the tail; the driver can only
    check the name) and attached=False, so a's client owns it and its jobs carry no word
    (stamp 0), its open's word job too, which every worker answers. The worker kept the old
    binding (the broker never forwarded the close, or forwarded it: a closed binding stays
    until room is needed), and a stamp-0 job changes no stamped grant: b's jobs run in a's
    private session and b's fetches of its values are sealed for b. On 0f5e5cc an owner job
    without a word bound the session to its owner alone again.

    Fixed (fail closed): a job without a word never runs under a kept grant admitting
    others, so a's open fails loudly on its word job and none of a's private inputs
    reaches the session. b stays admitted by a's own grant of the old session, which
    holds nothing of a's private one."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    assert _runs(worker, _job(a, PROJ, worded([1], SHARED, t + 1))) == [1]  # shared "proj"
    assert _runs(worker, _job(b, PROJ, worded([2], None))) == [2]
    worker.inbound(SessionClosed(PROJ, "closed by its owner"))  # (or never forwarded)
    # a's new private "proj", given the old id: its word job and its jobs, no word
    word_job = _runs(worker, _job(a, PROJ))
    assert _refused(word_job) and "did not make" in word_job.error.message
    assert word_job.error.op == "session"
    assert _refused(_runs(worker, _job(a, PROJ, ["a's private input"])))


def test_a_taken_back_share_sticks_when_the_broker_has_the_binding_evicted() -> None:
    """a shares "sa" with b (stamp 1) and takes it back (stamp 2, a's other client). The
    broker (b's operator) tells the worker "sa" closed (its word alone: a's session stays
    open at every driver) and binds new sessions of b's own until the worker evicts the
    closed binding to make room (the bound made small here; 20,000 on a real worker, one
    cheap job each). a's first client, still holding share_with=[b] (or a job of it the
    broker held back), runs its next job: a binding made anew from its older grant, which
    admits b again. Fixed: the worker marks a's grants up to the evicted one as forgotten,
    and an older grant admitting others binds nothing anew (a re-grants)."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    worker.admission = SessionAdmission(limit=3)  # the bound, made small
    worker._solo = worker.admission.solo
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    first_client = _job(a, "sa", worded(["a's next value"], SHARED, t + 1))
    assert _runs(worker, _job(a, "sa", worded([1], SHARED, t + 1))) == [1]
    assert _runs(worker, _job(a, "sa", worded([2], ALONE, t + 2))) == [2]  # taken back
    assert _refused(_runs(worker, _job(b, "sa", worded(["v"], None))))
    worker.inbound(SessionClosed("sa", "forged by the broker"))
    for own in ("m1", "m2", "m3"):  # b's own sessions: the third evicts "sa"'s binding
        assert _runs(worker, _job(b, own)) is None
    worker.inbound(SessionClosed("m1", "b's own, closed: room for one"))
    older = _runs(worker, first_client)  # a's job: refused, its grant older than forgotten
    assert _refused(older) and "older than what this worker remembers" in older.error.message
    assert _refused(_runs(worker, _job(b, "sa", worded(["v"], None))))
    assert _fetched_by(worker, b, "sa", "v") is None


def worker_with_a_model(node: Sealer, root: Path) -> tuple[WorkerSeal, ObjectStore]:
    """A worker's seal holding at most 3 sessions' bindings, and its store on ``root``
    where driver a persisted "model" from a private session (a's)."""
    worker = WorkerSeal(node, 0)
    worker.admission = SessionAdmission(limit=3)
    worker._solo = worker.admission.solo
    store = ObjectStore(SymbolDisk(root), worker.admission.owner)
    assert store.disk is not None
    store.disk.save(SymbolInfo("model", "", (0,), True, {}), "a's model", "driver:a")
    return worker, store


def test_a_revoked_sharee_reads_no_persisted_value_of_the_owner(tmp_path: Path) -> None:
    """As in the test above, on a worker with a data root where a persisted "model" (owner
    a, saved from a private session of a). Once the broker has the binding evicted and a's
    first client rebinds "sa" with its older grant, the worker reads a's "model" for a
    fetch in "sa" (the session is bound to a: its owner) and seals the answer for b."""
    a, b, node = _sealers()
    worker, store = worker_with_a_model(node, tmp_path)
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    first_client = _job(a, "sa", worded(None, SHARED, t + 1))
    assert _runs(worker, _job(a, "sa", worded(None, SHARED, t + 1))) is None
    assert _runs(worker, _job(a, "sa", worded(None, ALONE, t + 2))) is None  # taken back
    worker.inbound(SessionClosed("sa", "forged by the broker"))
    for own in ("m1", "m2", "m3"):
        assert _runs(worker, _job(b, own)) is None
    worker.inbound(SessionClosed("m1", "b's own, closed: room for one"))
    assert _refused(_runs(worker, first_client))  # its grant: older than forgotten
    try:  # what the worker's fetch task reads for a Fetch of sym:model in "sa"
        read = store.get("sa", "sym:model")
    except SessionAccessError:
        read = None
    leaked = read is not None and _fetched_by(worker, b, "sa", "sym:model") is not None
    assert not leaked


def test_the_owners_member_client_puts_no_value_where_another_driver_bound_its_session() -> None:
    """a owns "sa"; this worker restarted (or the broker left it out of a's open), so no
    word of a's reached it. b (the broker's driver) binds "sa" here first, its own grant
    admitting a. a's jobs as owner would be refused (a denial of service), and a's other
    client, attached without share_with, cannot tell it owns the session and claims no
    say: its job ran here, in a session bound to b, and b's fetch of its value was sealed
    for b.

    Fixed: the session's id names its owner (``session_id``: the broker draws it for the
    driver that opened it, which checks it), so b binds it nowhere, by no word, a grant or
    one flagged as opening; a's member job is refused (the owner's word has not reached
    this worker) and b's fetch is sealed for no one."""
    a, b, node = _sealers()
    sa = session_id("sa", "driver:a")  # the id a's open checked: it names a
    worker = WorkerSeal(node, 0)  # restarted: no binding here
    for bindings in (
        worded(None, SHARED, time.time_ns()),
        worded(None, SHARED, time.time_ns(), opening=True),
        worded(None, ["driver:b"], time.time_ns()),
        None,
    ):
        took = _runs(worker, _job(b, sa, bindings))
        assert _refused(took) and "names another driver as its owner" in took.error.message
    assert worker.admission.owner(sa) == "" and len(worker.admission) == 0
    ran = _runs(worker, _job(a, sa, worded(["a's secret input"], None)))
    assert _refused(ran) and "has not reached this worker" in ran.error.message
    assert _fetched_by(worker, b, sa, "v") is None
    # a's own word binds it, and then a's member client runs there, admitted by a alone
    assert _runs(worker, _job(a, sa, worded(None, ALONE, time.time_ns()))) is None
    assert _runs(worker, _job(a, sa, worded(["a's input"], None))) == ["a's input"]
    assert _fetched_by(worker, b, sa, "v") is None


# -- against real mpl-worker processes (CURVE), the broker tapped ----------------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster of two nodes whose spec lists drivers analyst and mallory (whose
    key the broker's operator holds)."""
    yield from two_workers(tmp_path, ("analyst", "mallory"))


@pytest.mark.daemons
def test_the_broker_cannot_bind_the_owners_session_to_its_driver_on_a_restarted_worker(
    rig: Rig,
) -> None:
    """Finding 3 with real daemons: the analyst opens "sa" (bound to it on both workers);
    worker 1 restarts, so no word of the analyst's is there. The broker hands worker 1,
    ahead of mallory's own job, a job of mallory's sealed for the analyst's session with a
    grant admitting the analyst: it bound the session to mallory there. The analyst's
    second client, attached without share_with (a member), then ran its job on worker 1,
    and mallory's forged fetch of its value was sealed for mallory. Now the worker refuses
    mallory's job (the id names the analyst), the member's job is refused, and mallory
    reads nothing."""
    replies: list[Reply] = recorded_replies(rig)
    with rig.connect(session="sa") as owner:
        rig.stop_worker(1)
        rig.start_worker(1)  # a new process: no binding of "sa"
        with rig.connect("mallory") as mallory:
            seal = mallory.client.seal
            assert seal is not None
            b = GraphBuilder(2)
            g = b.build([b.op("constant", [], ranks=(1,), value="mallory's")[0]])
            mallory.client.submit(mallory.session, g, {})  # its program cached on P1
            seal.speak_for(owner.session, True, ["analyst"])  # mallory's grant, sealed
            binding = seal.exec(Exec(owner.session, "bind", g.digest, (1,), {}, (1,), 30.0))

            def add(msg: Any) -> list[Any] | None:  # mallory's next Exec, "bind" first
                if isinstance(msg, Exec) and msg.session == mallory.session:
                    rig.tap.alter = None
                    return [binding, msg]
                return None

            rig.tap.alter = add
            mallory.client.submit(mallory.session, g, {})
            got = wait_until(
                lambda: [m for m in rig.tap.received if getattr(m, "job", "") == "bind"],
                20,
                "the worker's answer to mallory's binding job",
            )
            assert [type(m) for m in got] == [Failed], got
            assert "names another driver as its owner" in got[0].error.message
            refusal = ""
            with rig.connect(session="sa") as member:  # attached, no share_with
                try:
                    made: str | None = _value_on(member, 1, "the analyst's secret")
                except mp.SessionError as exc:
                    refusal, made = str(exc), None
            read = None
            if made is not None:  # the broker forges mallory's next fetch for it
                decoy = _value_on(mallory, 1, "mallory's own")
                read = _forged_fetch_read(rig, mallory, replies, 1, decoy, owner.session, made)
            assert read is None, f"mallory read {read!r}"
            assert made is None and "has not reached this worker" in refusal


@pytest.mark.daemons
def test_a_driver_acts_in_a_session_it_owns_only_under_an_id_naming_it(rig: Rig) -> None:
    """The broker answers an open as new, or an attach with share_with (both the owner's
    alone), with an id of the session's name but naming mallory as its owner: the
    analyst's driver refuses it (its grant would bind nothing on a worker, and the id is
    not of its session), and acts once the broker answers honestly."""
    with rig.connect(session="p"):
        shares: tuple[tuple[str, list[str] | None], ...] = (("q", None), ("p", []))
        for name, share in shares:

            def lie(msg: Any, name: str = name) -> list[Any] | None:
                if isinstance(msg, SessionOpened):
                    rig.tap.alter = None
                    return [replace(msg, session=session_id(name, "driver:mallory"))]
                return None

            rig.tap.alter = lie
            with pytest.raises(AuthenticationError, match="naming another owner"):
                rig.connect(session=name, share_with=share)
            assert rig.tap.alter is None  # the broker did lie
        with rig.connect(session="p", share_with=[]) as honest:
            assert binds_owner(honest.session, "driver:analyst")
            assert _value_on(honest, 0, "made") and _value_on(honest, 1, "made")
