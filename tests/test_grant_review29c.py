"""Review w29-c of ``mpl.worker.admission.SessionAdmission`` (branch w29-grant2): attacks
by a hostile broker whose operator holds a listed driver key (mallory), on the pure rules
(the class is the worker's whole decision; its callers pass the sealed word through).
Stamps are plain ints; the worker's clock reads 100 (its start, and when a job without a
word binds a session).
"""

from __future__ import annotations

from pathlib import Path

from test_grant_review29 import worker_with_a_model
from test_session_driver_binding import _fetched_by, _job, _runs, _sealers

from mpl.wire.errors import SessionAccessError
from mpl.wire.jobs import Failed
from mpl.wire.session_word import worded
from mpl.wire.sessions import SessionClosed
from mpl.worker.admission import SessionAdmission
from mpl.worker.sealing import WorkerSeal

A, M = "driver:a", "driver:mallory"
SHARED = frozenset((A, M))
ALONE = frozenset((A,))


def _grant(admission: SessionAdmission, session: str, admits: frozenset[str], stamp: int) -> str:
    return admission.admit(session, A, admits, True, stamp)  # a's grant, sealed by a


def _evict(admission: SessionAdmission, session: str, filler: int) -> None:
    """The broker forges ``session``'s close, then opens sessions of its own listed key
    until the worker makes room by evicting it (as test_grant_review29 does on daemons)."""
    admission.closed(session)
    for i in range(filler):
        assert admission.admit(f"m{i}", M, None, False) == ""
        admission.closed(f"m{i}")
    assert admission.owner(session) == ""


def test_a_taken_back_share_stays_taken_back_after_eviction_via_an_older_solo_grant() -> None:
    admission = SessionAdmission(limit=3, clock=lambda: 100)
    # a shares s with mallory, takes it back, shares again, takes it back (four
    # re-attaches with share_with); the broker keeps one job of grants 102 and 103
    for stamp, admits in ((101, SHARED), (102, ALONE), (103, SHARED), (104, ALONE)):
        assert _grant(admission, "s", admits, stamp) == ""
    assert admission.may_read("s", M) != ""  # taken back
    _evict(admission, "s", filler=3)
    assert admission.forgotten(A) == 104
    assert _grant(admission, "s", SHARED, 103) != ""  # alone, the mark refuses it
    assert _grant(admission, "s", ALONE, 102) == ""  # a's own older word: binds, alone
    _grant(admission, "s", SHARED, 103)  # the held-back sharing grant, now replaying
    assert admission.may_read("s", M) != "", "the taken-back share is back"
    assert admission.admit("s", M, None, True) != ""


def test_a_taken_back_share_stays_taken_back_after_a_restart_via_an_older_solo_grant() -> None:
    admission = SessionAdmission(clock=lambda: 100)  # restarted at 100; grants made before
    assert _grant(admission, "s", SHARED, 60) != ""  # refused alone, by the mark
    assert _grant(admission, "s", ALONE, 50) == ""  # held back: binds a alone
    _grant(admission, "s", SHARED, 60)  # held back, made before the take-back at 70
    assert admission.may_read("s", M) != "", "a share taken back before the restart is back"


def test_a_shared_open_given_an_old_private_sessions_id_admits_no_sharee_to_it() -> None:
    admission = SessionAdmission(clock=lambda: 100)
    old = "proj~0123456789abcdef"
    assert admission.admit(old, A, None, False) == ""  # a's private "proj", values here
    # a (any client) later opens "proj" again, shared with mallory (grant stamped 200);
    # the broker withholds the old close and gives the same id, which names "proj", as a
    # fresh open (attached=False): a's grant says so, sealed, and is refused (fail closed)
    assert admission.admit(old, A, SHARED, True, 200, True) != ""
    assert admission.may_read(old, M) != "", "mallory reads a's private session's values"


def test_the_owners_short_path_job_keeps_its_session_from_eviction_as_the_full_path() -> None:
    a, b, node = _sealers()  # b: mallory's listed key
    worker = WorkerSeal(node, 0)
    worker.admission = SessionAdmission(limit=2)  # the bound, made small
    worker._solo = worker.admission.solo
    assert _runs(worker, _job(a, "s")) is None  # a's private session, bound (full path)
    # the broker forges s's close (and enough others to flush the worker's closed-session
    # memory, so a's jobs in s run again and make values there)
    worker.inbound(SessionClosed("s", "forged"))
    assert _runs(worker, _job(a, "s")) is None  # a's next job: the short path
    assert _runs(worker, _job(a, "s")) is None
    assert _runs(worker, _job(b, "f")) is None  # mallory fills the bound...
    worker.inbound(SessionClosed("f", "closed"))
    assert _runs(worker, _job(b, "g")) is None  # ...and makes room: f, or a's s in use?
    assert type(_runs(worker, _job(b, "s"))) is Failed, "mallory bound a's session in use"
    assert _fetched_by(worker, b, "s", "v") is None


def test_a_sharees_job_keeps_its_session_from_eviction_as_the_owners_does() -> None:
    b = "driver:b"
    admission = SessionAdmission(limit=2, clock=lambda: 100)
    assert _grant(admission, "s", frozenset((A, b)), 101) == ""  # a shares s with b
    admission.closed("s")  # forged (and the worker's closed-session memory flushed)
    assert admission.admit("s", b, None, True) == ""  # b works on in s, making values
    assert admission.admit("f", M, None, False) == ""  # mallory fills the bound...
    admission.closed("f")
    assert admission.admit("g", M, None, False) == ""  # ...and makes room: f, or s in use?
    assert admission.admit("s", M, None, False) != "", "mallory bound b's session in use"
    assert admission.may_read("s", M) != ""


def test_a_taken_back_share_leaks_no_persisted_value_via_an_older_solo_grant(
    tmp_path: Path,
) -> None:
    a, b, node = _sealers()  # b: mallory's listed key
    worker, store = worker_with_a_model(node, tmp_path)
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    shared, alone = ["driver:a", "driver:b"], ["driver:a"]
    held = [_job(a, "sa", worded(None, w, t + i)) for i, w in ((2, alone), (3, shared))]
    for i, w in ((1, shared), (2, alone), (3, shared), (4, alone)):  # share, take back x2
        assert _runs(worker, _job(a, "sa", worded(None, w, t + i))) is None
    worker.inbound(SessionClosed("sa", "forged by the broker"))
    for own in ("m1", "m2", "m3"):
        assert _runs(worker, _job(b, own)) is None
    worker.inbound(SessionClosed("m1", "b's own, closed: room for one"))
    assert worker.admission.owner("sa") == ""  # evicted; a's mark: t + 4
    for job in held:  # the broker replays them, the older first
        _runs(worker, job)
    try:  # what the worker's fetch task reads for a Fetch of sym:model in "sa"
        read = store.get("sa", "sym:model")
    except SessionAccessError:
        read = None
    leaked = read is not None and _fetched_by(worker, b, "sa", "sym:model") is not None
    assert not leaked, "b reads a's persisted model after a took the share back"
