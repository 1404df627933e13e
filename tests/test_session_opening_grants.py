"""The rules that close review w29-c: a grant flagged as opening its session (its client's
open the broker answered as new) never replaces a binding it did not make; a binding made
anew is stamped at least at its owner's mark; a closed session is out of the short path
until a job (the owner's or a sharee's) un-closes it. Stamps are plain ints; the worker's
clock reads 100.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from test_session_driver_binding import _job, _runs, _sealers

from mpl.driver.sealing import DriverSeal
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Failed
from mpl.wire.session_word import read_word, worded
from mpl.worker.admission import SessionAdmission
from mpl.worker.sealing import WorkerSeal

A, B = "driver:a", "driver:b"
SHARED = frozenset((A, B))
ALONE = frozenset((A,))


def _grant(
    admission: SessionAdmission, session: str, admits: frozenset[str], stamp: int, opening: bool
) -> str:
    if not opening:  # (as the callers before the flag: those tests fail on behaviour there)
        return admission.admit(session, A, admits, True, stamp)
    return admission.admit(session, A, admits, True, stamp, opening)


def test_a_grant_flagged_as_opening_reads_back_and_a_malformed_flag_is_refused() -> None:
    flagged = worded([1], [A, B], 7, True)
    assert read_word(flagged) == (SHARED, 7, True, [1])
    assert read_word(worded(None, [A], 7)) == (ALONE, 7, False, None)
    assert read_word(worded(None, None)) == (None, 0, False, None)
    for bad in (False, 1, "yes", None):
        with pytest.raises(ProtocolError, match="flags its opening"):
            read_word({**flagged, "opening": bad})
    with pytest.raises(ProtocolError, match="neither a list"):
        read_word({**flagged, "more": 1})
    with pytest.raises(ProtocolError, match="neither a list"):  # a member's, flagged
        read_word({"admits": None, "inputs": None, "opening": True})


def test_a_flagged_grant_binds_anew_or_restates_itself_and_replaces_no_other_binding() -> None:
    admission = SessionAdmission(clock=lambda: 100)
    assert _grant(admission, "s", SHARED, 200, True) == ""  # binds a new session
    assert _grant(admission, "s", SHARED, 200, True) == ""  # restates itself
    assert admission.may_read("s", B) == ""
    assert admission.admit("p", A, None, False) == ""  # a's private session (stamp 100)
    refused = _grant(admission, "p", SHARED, 201, True)  # given p's id as a new open
    assert "already holds a session of that id" in refused
    assert admission.may_read("p", B) != "" and admission.solo["p"] == A
    assert _grant(admission, "s", SHARED, 202, True) != ""  # another flagged grant: refused
    assert _grant(admission, "s", ALONE, 300, False) == ""  # a re-attach takes it back
    assert _grant(admission, "s", SHARED, 200, True) == ""  # the first client: runs, older
    assert admission.may_read("s", B) != ""  # ...and the newer grant stands


def test_a_flagged_grant_raised_to_the_mark_still_restates_itself() -> None:
    admission = SessionAdmission(clock=lambda: 100)  # started at 100
    assert _grant(admission, "s", ALONE, 50, True) == ""  # binds, stamped at the mark
    assert _grant(admission, "s", ALONE, 50, True) == ""  # its next job: itself
    assert _grant(admission, "s", SHARED, 60, False) == ""  # older than the mark: no change
    assert admission.may_read("s", B) != ""


def test_a_binding_made_anew_is_stamped_at_least_at_its_owners_mark() -> None:
    admission = SessionAdmission(limit=1, clock=lambda: 100)
    assert _grant(admission, "s", ALONE, 150, False) == ""
    admission.closed("s")
    assert admission.admit("t", B, None, False) == ""  # evicts s: a's mark is 150
    assert admission.forgotten(A) == 150
    admission.closed("t")
    assert admission.admit("s", A, None, False) == ""  # no word, clock 100: stamped 150
    assert _grant(admission, "s", SHARED, 140, False) == ""  # at or below the mark: no change
    assert _grant(admission, "s", SHARED, 150, False) == ""
    assert admission.may_read("s", B) != "" and admission.solo == {"s": A}
    assert _grant(admission, "s", SHARED, 151, False) == ""  # a newer grant does
    assert admission.may_read("s", B) == ""


def test_a_closed_session_leaves_the_short_path_until_a_job_un_closes_it() -> None:
    admission = SessionAdmission(clock=lambda: 100)
    assert admission.admit("s", A, None, False) == "" and admission.solo == {"s": A}
    admission.closed("s")
    assert admission.solo == {}
    assert admission.admit("s", A, None, False) == ""  # the full path: back
    assert admission.solo == {"s": A}
    admission.all_closed()
    assert admission.solo == {}


def test_a_flagged_grant_sealed_by_a_driver_is_refused_where_another_binding_is_kept() -> None:
    a, _, node = _sealers()
    worker = WorkerSeal(node, 0)
    assert _runs(worker, _job(a, "p")) is None  # a's private session
    t = time.time_ns() + 10**9  # made after the private session's binding
    failed: Any = _runs(worker, _job(a, "p", worded(None, [A, B], t, True)))
    assert type(failed) is Failed and failed.error.kind == "SessionAccessError"
    assert worker.admission.may_read("p", B) != ""
    assert _runs(worker, _job(a, "q", worded(None, [A, B], t, True))) is None  # a new one
    assert worker.admission.may_read("q", B) == ""


def test_a_driver_flags_the_grant_of_an_open_answered_as_new() -> None:
    a, _, _ = _sealers()
    seal = DriverSeal(a, SimpleNamespace(cluster=None), False)  # type: ignore[arg-type]
    seal.speak_for("s", True, ["b"], True)
    seal.speak_for("t", True, ["b"])
    assert seal.words["s"] is not None and seal.words["s"][2] is True
    assert seal.words["t"] is not None and seal.words["t"][2] is False
