"""Review w29-c of ``mpl.worker.admission.SessionAdmission`` (branch w29-grant2): attacks
by a hostile broker whose operator holds a listed driver key (mallory), on the pure rules
(the class is the worker's whole decision; its callers pass the sealed word through).
Stamps are plain ints; the worker's clock reads 100 (its start, and when a job without a
word binds a session).
"""

from __future__ import annotations

import pytest

from mpl.worker.admission import SessionAdmission

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


@pytest.mark.xfail(
    strict=True,
    reason="review w29-c finding 1: the forgotten mark is checked only when a grant binds "
    "a session anew; an older grant of the owner alone rebinds first, then an older "
    "sharing grant replaces it and the taken-back share is back",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="review w29-c finding 1 (restart): after a worker restart an older grant of the "
    "owner alone rebinds, then an older sharing grant (made before the start) replaces it",
)
def test_a_taken_back_share_stays_taken_back_after_a_restart_via_an_older_solo_grant() -> None:
    admission = SessionAdmission(clock=lambda: 100)  # restarted at 100; grants made before
    assert _grant(admission, "s", SHARED, 60) != ""  # refused alone, by the mark
    assert _grant(admission, "s", ALONE, 50) == ""  # held back: binds a alone
    _grant(admission, "s", SHARED, 60)  # held back, made before the take-back at 70
    assert admission.may_read("s", M) != "", "a share taken back before the restart is back"


@pytest.mark.xfail(
    strict=True,
    reason="review w29-c finding 2: the broker answers the owner's shared open with the id "
    "of the owner's older private session (its close withheld, its values still here); the "
    "new grant replaces the private binding and the sharee reads the private session",
)
def test_a_shared_open_given_an_old_private_sessions_id_admits_no_sharee_to_it() -> None:
    admission = SessionAdmission(clock=lambda: 100)
    old = "proj~0123456789abcdef"
    assert admission.admit(old, A, None, False) == ""  # a's private "proj", values here
    # a (any client) later opens "proj" again, shared with mallory (grant stamped 200);
    # the broker withholds the old close and gives the same id, which names "proj"
    assert _grant(admission, old, SHARED, 200) == ""
    assert admission.may_read(old, M) != "", "mallory reads a's private session's values"
