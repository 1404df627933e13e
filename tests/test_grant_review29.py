"""Review w29-a: a session's stamped grants (``mpl.worker.admission``) against a hostile
broker whose operator holds a listed driver key (driver b, "mallory"), and what a grant
lets a driver read of the owner's persisted values (``mpl.worker.symbol_owner``).

Strict xfails: each shows a finding of the review; the lead fixes them.
"""

from __future__ import annotations

import pytest
from test_session_driver_binding import _fetched_by, _job, _runs, _sealers

from mpl.wire.jobs import Failed
from mpl.wire.session_word import worded
from mpl.wire.sessions import SessionClosed
from mpl.worker.sealing import WorkerSeal

SHARED = ["driver:a", "driver:b"]
PROJ = "proj~0123456789abcdef"  # a session a named "proj" (its id: name and a tail)


def _refused(got: object) -> bool:
    return type(got) is Failed and got.error.kind == "SessionAccessError"


@pytest.mark.xfail(
    strict=True,
    reason="review w29-a finding 1: a stamp-0 job (a private open) no longer resets a kept "
    "grant, so a broker answering a's new open of 'proj' with the id of a's old shared "
    "'proj' (ids are the broker's draw) keeps b admitted in a's private session",
)
def test_a_private_reopen_given_an_old_shared_sessions_id_admits_no_sharee() -> None:
    """a once opened "proj" sharing it with b (a grant, stamp 1), and closed it. Later a
    opens "proj" again, without share_with: a private session. The broker (b's operator)
    answers the open with the old session's id (it draws the tail; the driver can only
    check the name) and attached=False, so a's client owns it and its jobs carry no word
    (stamp 0), its open's word job too, which every worker answers. The worker kept the old
    binding (the broker never forwarded the close, or forwarded it: a closed binding stays
    until room is needed), and a stamp-0 job changes no stamped grant: b's jobs run in a's
    private session and b's fetches of its values are sealed for b. On 0f5e5cc an owner job
    without a word bound the session to its owner alone again."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    assert _runs(worker, _job(a, PROJ, worded([1], SHARED, 1))) == [1]  # shared "proj"
    assert _runs(worker, _job(b, PROJ, worded([2], None))) == [2]
    worker.inbound(SessionClosed(PROJ, "closed by its owner"))  # (or never forwarded)
    # a's new private "proj", given the old id: its word job and its jobs, no word
    assert _runs(worker, _job(a, PROJ)) is None
    assert _runs(worker, _job(a, PROJ, ["a's private input"])) == ["a's private input"]
    assert _refused(_runs(worker, _job(b, PROJ, worded(["v"], None))))
    assert _fetched_by(worker, b, PROJ, "v") is None
