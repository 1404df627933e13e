"""The pure rules of ``mpl.worker.admission.SessionAdmission`` that close review w29-a
findings 1 and 2: a job without a word never runs under a kept grant admitting others,
and a grant admitting others older than what the worker forgot of its owner binds no
session anew. Stamps here are plain ints; the worker's clock reads 100 (its start, and when a job
without a word binds a session).
"""

from __future__ import annotations

from test_session_driver_binding import _fetched_by, _job, _runs, _sealers

from mpl.wire.jobs import Failed
from mpl.wire.session_word import MAX_STAMP, worded
from mpl.worker.admission import SessionAdmission
from mpl.worker.sealing import WorkerSeal

A, B, M = "driver:a", "driver:b", "driver:mallory"
PROJ = "proj~0123456789abcdef"
SHARED = frozenset((A, B))
ALONE = frozenset((A,))


def _no_word(admission: SessionAdmission, session: str, driver: str = A) -> str:
    return admission.admit(session, driver, None, False)


def _grant(admission: SessionAdmission, session: str, admits: frozenset[str], stamp: int) -> str:
    return admission.admit(session, A, admits, True, stamp)  # a's grant


def _member(admission: SessionAdmission, session: str, driver: str = B) -> str:
    return admission.admit(session, driver, None, True)


def test_a_job_without_a_word_runs_only_where_the_kept_grant_admits_its_owner_alone() -> None:
    admission = SessionAdmission(clock=lambda: 100)
    assert _no_word(admission, "s") == ""  # a private open: bound to a alone
    assert admission.solo == {"s": A}
    assert _grant(admission, "s", SHARED, 101) == ""  # another client of a shares it
    assert "s" not in admission.solo
    refused = _no_word(admission, "s")
    assert "did not make" in refused and "share_with" in refused
    assert _member(admission, "s") == ""  # b, admitted by a's grant, still runs
    assert admission.may_read("s", B) == ""  # (the refusal changed no grant)
    assert _grant(admission, "s", ALONE, 102) == ""  # taken back: a alone
    assert _no_word(admission, "s") == "" and admission.solo == {"s": A}
    assert _member(admission, "s") != ""


def test_a_grant_admitting_others_binds_anew_only_if_newer_than_the_workers_start() -> None:
    admission = SessionAdmission(clock=lambda: 100)
    assert admission.forgotten(A) == 100
    refused = _grant(admission, "s", SHARED, 100)  # made before this worker started
    assert "older than what this worker remembers" in refused
    assert len(admission) == 0 and admission.may_read("s", B) != ""
    assert _grant(admission, "t", ALONE, 1) == ""  # admits only its owner: binds
    assert _no_word(admission, "u") == ""  # no word: binds
    assert _grant(admission, "s", SHARED, 101) == ""  # newer: binds, admitting b
    assert admission.may_read("s", B) == ""
    assert _grant(admission, "s", SHARED, 50) == ""  # s bound: an older grant runs, no change
    assert admission.may_read("s", B) == ""


def test_an_evicted_binding_raises_its_owners_mark_to_its_grant() -> None:
    admission = SessionAdmission(limit=2, clock=lambda: 100)
    assert _grant(admission, "s", SHARED, 150) == ""
    assert _grant(admission, "s", ALONE, 160) == ""  # taken back
    admission.closed("s")
    assert _no_word(admission, "m1", M) == "" and _no_word(admission, "m2", M) == ""  # evicts s
    assert admission.owner("s") == ""
    assert admission.forgotten(A) == 160
    assert admission.forgotten(M) == 100  # another owner's mark: its start still
    assert "older than" in _grant(admission, "s", SHARED, 150)  # a's older grant: no rebind
    assert "older than" in _grant(admission, "s", SHARED, 160)
    admission.closed("m1")
    assert _grant(admission, "s", ALONE, 10) == ""  # a alone: binds whatever its stamp
    assert admission.may_read("s", B) != ""
    assert _grant(admission, "s", SHARED, 161) == ""  # a's new grant, s bound: it stands
    assert admission.may_read("s", B) == ""


def test_a_mark_rises_only_for_the_owner_whose_binding_was_evicted() -> None:
    """mallory (a listed driver) binds a session of its own with the highest stamp, closes
    it and has it evicted: its own mark rises, a's does not, so a's new grants still bind
    (one shared mark would refuse every grant on this worker from then on)."""
    admission = SessionAdmission(limit=1, clock=lambda: 100)
    assert admission.admit("m", M, frozenset((M,)), True, MAX_STAMP) == ""
    admission.closed("m")
    assert _grant(admission, "s", SHARED, 101) == ""  # evicts m
    assert admission.forgotten(M) == MAX_STAMP and admission.forgotten(A) == 100


def test_the_bindings_and_marks_stay_bounded() -> None:
    """10,000 sessions of three owners, each shared, closed and evicted in turn: the
    bindings stay at the bound, the marks at one per owner, each the newest evicted."""
    admission = SessionAdmission(limit=8, clock=lambda: 100)
    owners = (A, B, M)
    for n in range(10_000):
        owner = owners[n % 3]
        session = f"s{n}"
        assert admission.admit(session, owner, frozenset((owner, "driver:x")), True, 101 + n) == ""
        admission.closed(session)
        assert len(admission) <= 8
    assert len(admission._forgotten) == 3
    evicted_last = 10_000 - 8 - 1  # the newest evicted session's number
    assert max(admission.forgotten(o) for o in owners) == 101 + evicted_last
    assert len(admission.solo) == 0 and len(admission._closed) == 8


def test_a_held_back_older_grant_does_not_share_a_private_session_given_its_id() -> None:
    """Finding 1 where the old binding never formed: a's old shared "proj" ran no job on
    this worker (it joined later; the broker held back a's first job there, a grant
    admitting b). a opens "proj" again, privately; the broker reuses the old id, and a's
    open binds it here to a alone (no word). The broker then hands on the held-back job:
    its grant, made before that binding, must not share the session with b."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    held = _job(a, PROJ, worded(None, ["driver:a", "driver:b"], worker.admission.started + 1))
    assert _runs(worker, _job(a, PROJ)) is None  # a's private open, the old id
    assert _runs(worker, _job(a, PROJ, ["a's private input"])) == ["a's private input"]
    assert _runs(worker, held) is None  # a's job: it runs, and shares nothing
    assert type(_runs(worker, _job(b, PROJ, worded(["v"], None)))) is Failed
    assert _fetched_by(worker, b, PROJ, "v") is None
