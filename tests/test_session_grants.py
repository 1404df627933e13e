"""Who a session admits is its owner's newest grant (``mpl.wire.session_word``,
``mpl.worker.admission``): a list the owner stamps when it makes it and seals into its
jobs; a worker keeps the grant with the highest stamp it has seen, one per session.

Attacks of a hostile broker whose operator holds a listed driver key: a grant it tampers
with or replays, a sharee (or another driver) claiming a grant, many grants for one
session against the bound on the worker's bindings. Then legitimate use against real
``mpl-worker`` processes: sharing, re-sharing with another list, re-attaching without
``share_with``, and the owner's clients that hold an older grant or none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_replay_restart import Rig, two_workers
from test_session_driver_binding import _fetched_by, _job, _runs, _sealers, _value_on

import mpl.driver as mp
from mpl.wire.jobs import Failed
from mpl.wire.session_word import MAX_STAMP, worded
from mpl.worker.admission import SessionAdmission
from mpl.worker.sealing import WorkerSeal

SHARED = ["driver:a", "driver:b"]
ALONE = ["driver:a"]


def _refused(got: Any, kind: str = "SessionAccessError") -> bool:
    return type(got) is Failed and got.error.kind == kind


def test_a_grant_the_broker_tampers_with_or_replays_does_not_undo_a_later_one() -> None:
    """a shares "sa" with b (stamp 1), then takes it back (stamp 2). The broker holds one
    job of each grant: a copy with its bytes altered does not open; a replay of either
    runs nowhere; the older one handed on late runs once (a's job) and b stays out."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    assert _runs(worker, _job(a, "sa", worded([1], SHARED, t + 1))) == [1]
    old = _job(a, "sa", worded(None, SHARED, t + 1))  # held back by the broker
    back = _job(a, "sa", worded(None, ALONE, t + 2))
    assert _runs(worker, back) is None
    msg, sealed = old
    assert type(sealed) is bytes
    for at in (len(sealed) // 2, len(sealed) - 1):  # in the word's ciphertext, in its tag
        forged = sealed[:at] + bytes([sealed[at] ^ 1]) + sealed[at + 1 :]
        assert _refused(_runs(worker, (msg, forged)), "AuthenticationError")
    assert _refused(_runs(worker, back), "AuthenticationError")  # a replay
    assert _runs(worker, old) is None  # the older grant's job, late: it runs as a's
    assert _refused(_runs(worker, old), "AuthenticationError")  # once
    assert _refused(_runs(worker, _job(b, "sa", worded(["v"], None))))
    assert _fetched_by(worker, b, "sa", "v") is None


def test_only_the_bound_owners_grant_counts() -> None:
    """b, admitted to a's session, seals grants of its own for it (any stamp, the highest
    too): each is refused, before a takes the sharing back and after; a's older grant
    (another client of a holding it) changes nothing after the later one."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    t = worker.admission.started  # (a's grants are stamped after the worker started)
    assert _runs(worker, _job(a, "sa", worded([1], SHARED, t + 5))) == [1]
    for stamp in (t + 6, MAX_STAMP):
        claim = _runs(worker, _job(b, "sa", worded(None, ["driver:b"], stamp)))
        assert _refused(claim) and "belongs to another driver" in claim.error.message
    assert _runs(worker, _job(b, "sa", worded(["v"], None))) == ["v"]  # admitted by a's
    assert _runs(worker, _job(a, "sa", worded(None, ALONE, t + 7))) is None
    for stamp in (t + 8, MAX_STAMP):
        assert _refused(_runs(worker, _job(b, "sa", worded(None, SHARED, stamp))))
    assert _runs(worker, _job(a, "sa", worded(None, SHARED, t + 5))) is None  # a's other client
    assert _refused(_runs(worker, _job(b, "sa", worded(["v"], None))))
    assert _fetched_by(worker, b, "sa", "v") is None


def test_one_grant_is_kept_per_session_and_the_bindings_stay_bounded() -> None:
    """200 grants of a for one session, then older ones handed on late: one binding, the
    newest grant (a alone) standing; the bound on bindings counts sessions, not grants."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    worker.admission = SessionAdmission(limit=3)  # the bound, made small
    worker._solo = worker.admission.solo
    late = []
    for stamp in range(1, 201):
        job = _job(a, "s0", worded(None, SHARED if stamp % 2 else ALONE, stamp))
        if stamp % 10 == 1:
            late.append(job)  # a grant admitting b, held back
        else:
            assert _runs(worker, job) is None
    assert len(worker.admission) == 1
    for job in reversed(late):
        assert _runs(worker, job) is None
    assert _refused(_runs(worker, _job(b, "s0", worded(None, None))))
    assert _fetched_by(worker, b, "s0", "v") is None
    assert _runs(worker, _job(a, "s1")) is None and _runs(worker, _job(b, "s2")) is None
    full = _runs(worker, _job(b, "s3"))
    assert _refused(full) and "close sessions" in full.error.message
    assert len(worker.admission) == 3


@pytest.mark.parametrize(
    "word",
    [
        {"admits": SHARED, "granted": 0, "inputs": None},
        {"admits": SHARED, "granted": -1, "inputs": None},
        {"admits": SHARED, "granted": MAX_STAMP + 1, "inputs": None},
        {"admits": SHARED, "granted": True, "inputs": None},
        {"admits": SHARED, "granted": 1.5, "inputs": None},
        {"admits": SHARED, "granted": "1", "inputs": None},
        {"admits": SHARED, "inputs": None},  # an older driver's word: no stamp
        {"admits": None, "granted": 1, "inputs": None},
    ],
)
def test_a_grant_without_a_valid_stamp_is_refused(word: dict[str, Any]) -> None:
    """Only a listed driver can seal a word, but it is still network input: a stamp that
    is not a positive int64, or a list without one, is a ``ProtocolError``, and binds
    nothing (the valid grant after it, written out, binds the session to a)."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    assert _refused(_runs(worker, _job(b, "sa", word)), "ProtocolError")
    grant = {"admits": SHARED, "granted": worker.admission.started + 1, "inputs": [1]}
    assert _runs(worker, _job(a, "sa", grant)) == [1]
    assert _runs(worker, _job(b, "sa", worded([2], None))) == [2]


# -- against real mpl-worker processes (CURVE) -------------------------------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster of two nodes whose spec lists drivers analyst, auditor and
    reviewer."""
    yield from two_workers(tmp_path, ("analyst", "auditor", "reviewer"))


def _read(ctx: mp.Context, uri: str, rank: int) -> Any:
    """What ``ctx``'s driver reads of ``uri`` on ``rank`` in its session (None: refused)."""
    try:
        return ctx.client.fetch(ctx.session, rank, uri)
    except mp.SessionError:
        return None


@pytest.mark.daemons
def test_an_owner_shares_re_shares_and_re_attaches_and_its_newest_grant_stands(
    rig: Rig,
) -> None:
    """The analyst shares "collab" with the auditor, who runs and fetches on both ranks;
    a second client of the analyst re-shares it with the reviewer instead; the first
    client's next jobs (still holding its older grant) and a third client attaching
    without ``share_with`` (no say) leave the reviewer admitted and the auditor out."""
    with rig.connect(session="collab", share_with=["auditor"]) as first:
        made = [_value_on(first, rank, f"first on {rank}") for rank in (0, 1)]
        with rig.connect("auditor", session="collab") as auditor:
            assert _value_on(auditor, 0, "audited") and _value_on(auditor, 1, "audited")
            assert [_read(auditor, uri, rank) for rank, uri in enumerate(made)] == [
                "first on 0",
                "first on 1",
            ]
            with rig.connect(session="collab", share_with=["reviewer"]) as second:
                later = [_value_on(second, rank, f"second on {rank}") for rank in (0, 1)]
                later += [_value_on(first, rank, f"first again on {rank}") for rank in (0, 1)]
                with rig.connect(session="collab") as third:
                    later += [_value_on(third, rank, f"third on {rank}") for rank in (0, 1)]
                with rig.connect("reviewer", session="collab") as reviewer:
                    read = [_read(reviewer, uri, at % 2) for at, uri in enumerate(later)]
                assert read == [
                    f"{who} on {rank}"
                    for who in ("second", "first again", "third")
                    for rank in (0, 1)
                ]
                assert [_read(auditor, uri, at % 2) for at, uri in enumerate(later)] == [None] * 6


@pytest.mark.daemons
def test_a_client_that_opened_the_session_without_sharing_does_not_take_back_a_later_grant(
    rig: Rig,
) -> None:
    """The analyst opens "collab" without ``share_with`` (its jobs carry no word), then a
    second client of it shares the session with the auditor: the first client's later jobs
    change no grant; they are refused (a job without a word never runs under a grant
    admitting others: the stated cost), until that client re-attaches with ``share_with``,
    and the auditor reads what it makes then."""
    with (
        rig.connect(session="collab") as first,
        rig.connect(session="collab", share_with=["auditor"]),
    ):
        with pytest.raises(mp.MplError, match="did not make"):
            _value_on(first, 0, "made without a word")
        with rig.connect(session="collab", share_with=["auditor"]) as again:
            uri = _value_on(again, 0, "made under the grant")
            with rig.connect("auditor", session="collab") as auditor:
                assert _read(auditor, uri, 0) == "made under the grant"
