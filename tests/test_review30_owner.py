"""Review w30: session ids that name their owner (``mpl.wire.session_word.session_id``),
against a hostile broker whose operator holds a listed driver key (driver b, "mallory"):
it draws every id and relays everything.

* The id is read one way, whatever its name holds (``~``, ``|``, digits and colons, an
  id-shaped name), and a tail changed in case, padding or length names no driver that a
  driver of this kind acts in.
* Only the driver an id names binds it on a worker, by any word; a sharee waits for the
  owner's word there and runs under it.
* The driver acts as owner (an open answered as new, a fresh name, an attach with
  ``share_with``) only in an id of its name naming it: an older broker's form, another
  name, another owner, a tail bent in case or length are refused.
* Finding 1 (low, fixed): a refused open detached by the session's name, which the broker
  does not look sessions up by: the session an honest (older) broker opened for it stayed
  open, the client attached, until its lease ran out.
* Finding 2 (medium, fixed by ``owner=``; without it still under Limitations): an attach
  without ``share_with`` (the owner's other client, or a sharee) took an id of its name
  naming any owner, so the broker could seat it in a session its own driver bound; given
  the owner it means (``mp.connect(..., owner=NAME)``) it refuses an id naming another.
* Finding 3 (info, fixed): the fetch context's ``|`` separators let its two free fields
  (session, uri) trade characters; they are now each written after its length, as the
  Exec context's hashed fields are (a Done's ends in the job id and index, of fixed forms).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from test_replay_restart import Rig, two_workers
from test_session_driver_binding import _fetched_by, _job, _runs, _sealers, _value_on

import mpl.broker.sessions as broker_sessions
import mpl.driver as mp
from mpl.wire.errors import AuthenticationError
from mpl.wire.jobs import Failed
from mpl.wire.seal_contexts import fetch_context
from mpl.wire.session_word import binds_owner, id_of_session_named, session_id, worded
from mpl.wire.sessions import SessionOpened
from mpl.worker.sealing import WorkerSeal

A, B = "driver:a", "driver:b"
TAIL = 25  # "~", 8 random characters, 16 naming the owner
# names a driver may choose that could confuse a reader of ids splitting on a character
NAMES = (
    "p",
    "p~",
    "p|1:x",
    "8:driver:b",
    "q~" + "A" * 24,  # a name shaped like an id
    session_id("q", B),  # b's own id of "q", as a name
    "é~ü|",
    "n" * 128,  # the broker's bound
)


def _refused(got: object, why: str) -> bool:
    return type(got) is Failed and got.error.kind == "SessionAccessError" and why in str(got)


# -- the id's form: pure ------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_an_id_reads_one_way_whatever_its_name_holds(name: str) -> None:
    sid = session_id(name, A)
    assert id_of_session_named(sid, name)
    assert binds_owner(sid, A) and not binds_owner(sid, B)
    # no other prefix of the id reads as the name of the session it is an id of
    assert [cut for cut in range(len(sid) + 1) if id_of_session_named(sid, sid[:cut])] == [
        len(name)
    ]


def test_a_tail_bent_in_case_padding_or_length_is_no_id_a_driver_owns() -> None:
    """What the broker could answer an owner's open of "p" with, from a's honest id: the
    tag in another case, base64 padding, a character more or less, a tail in hex. A
    driver acts as owner only where the id is of its name and names it: none is."""
    sid = session_id("p", A)
    tail = sid[2:]
    bent = (
        "p~" + tail.swapcase(),
        "p~" + tail[:8] + tail[8:].swapcase(),  # the random part kept, the tag flipped
        sid + "=",
        sid + "==",
        sid[:-1],
        sid + "A",
        "p~" + secrets.token_hex(8),  # an older broker's form
        "p~" + secrets.token_hex(12),  # hex, 24 characters
    )
    for other in bent:
        assert not (id_of_session_named(other, "p") and binds_owner(other, A)), other
        if id_of_session_named(other, "p"):  # of the form: it names no listed driver
            assert not binds_owner(other, B), other


def test_an_older_form_id_is_no_id_of_its_name_to_this_driver() -> None:
    """Workers let any driver bind an id of the older form (no owner named): safe only
    because no driver of this kind acts in one, as owner or member."""
    for name in NAMES:
        assert not id_of_session_named(f"{name}~{secrets.token_hex(8)}", name)


# -- workers: only the named owner binds; sharees wait for its word ------------------------


@pytest.mark.parametrize("name", NAMES)
def test_only_the_driver_an_id_names_binds_it_and_a_sharee_waits_for_its_word(
    name: str,
) -> None:
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0)
    sid = session_id(name, A)
    now = time.time_ns()
    for bindings in (
        None,
        [1],
        worded(None, [A, B], now),
        worded(None, [A, B], now, opening=True),
        worded(None, [B], now),
    ):
        took = _runs(worker, _job(b, sid, bindings))
        assert _refused(took, "names another driver as its owner"), took
    assert _refused(_runs(worker, _job(b, sid, worded(["v"], None))), "has not reached")
    assert worker.admission.owner(sid) == "" and _fetched_by(worker, b, sid, "v") is None
    # a's grant admitting b binds it; then b runs there as a sharee, and reads
    assert _runs(worker, _job(a, sid, worded(None, [A, B], time.time_ns()))) is None
    assert _runs(worker, _job(b, sid, worded(["b's input"], None))) == ["b's input"]
    assert worker.admission.owner(sid) == A
    # b's own session of the same name is b's alone: a's owner jobs are refused there
    own = session_id(name, B)
    assert _runs(worker, _job(b, own)) is None
    assert _refused(_runs(worker, _job(a, own, ["a's input"])), "another driver")


# -- the driver, against a broker that bends its answers (real daemons) ---------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster of two nodes whose spec lists drivers analyst and mallory (whose
    key the broker's operator holds)."""
    yield from two_workers(tmp_path, ("analyst", "mallory"))


def _bent(honest: str) -> dict[str, str]:
    """Ids the broker may answer an open with, for the honest id it drew."""
    name = honest[:-TAIL]
    tail = honest[-TAIL + 1 :]
    return {
        "an older broker's form": f"{name}~{secrets.token_hex(8)}",
        "another name": session_id(name + "x", "driver:analyst"),
        "mallory as owner": session_id(name, "driver:mallory"),
        "the tag in another case": f"{name}~{tail[:8]}{tail[8:].swapcase()}",
        "padded": honest + "=",
    }


def _bent_as(what: str, honest: str) -> str:
    return _bent(honest)[what]


_MEMBER_TAKES = ("mallory as owner", "the tag in another case")


def _answer_with(rig: Rig, bend: Callable[[str], str]) -> None:
    """The broker's next SessionOpened carries ``bend(its honest id)`` instead."""

    def lie(msg: Any) -> list[Any] | None:
        if isinstance(msg, SessionOpened):
            rig.tap.alter = None
            return [replace(msg, session=bend(msg.session))]
        return None

    rig.tap.alter = lie


@pytest.mark.daemons
def test_the_driver_acts_as_owner_only_in_an_id_of_its_name_naming_it(rig: Rig) -> None:
    """Every way the driver comes to own a session (a named open answered as new, a fresh
    name, an attach with ``share_with``), answered with each bent id: refused, before any
    job. An attach without ``share_with`` (a member) refuses an id of another form or
    name; without ``owner=``, one naming another owner it takes (finding 2), and one
    naming no listed driver (the tag bent) too: no worker lets anyone bind it, so its
    jobs are refused there. Given ``owner=``, it refuses every bent id."""
    with rig.connect(session="p") as own:
        paths: tuple[dict[str, Any], ...] = (
            {"session": "q"},  # answered as new (a new name each time, below)
            {},  # a fresh name
            {"session": "p", "share_with": []},  # its own, attached with share_with
            {"session": "p"},  # attached without: a member
            {"session": "p", "owner": "analyst"},  # a member naming the owner it means
        )
        for n, (how, what) in enumerate(itertools.product(paths, _bent(own.session))):
            if how == {"session": "p"} and what in _MEMBER_TAKES:
                continue
            if how.get("session") == "q":  # (the last one's close may come after this open)
                how = {"session": f"q{n}"}
            _answer_with(rig, functools.partial(_bent_as, what))
            with pytest.raises(AuthenticationError, match="not the one asked for"):
                rig.connect(**how)
            assert rig.tap.alter is None, (how, what)  # the broker did bend it
        with rig.connect(session="p", share_with=[]) as honest:
            assert binds_owner(honest.session, "driver:analyst")
            assert _value_on(honest, 0, "made") and _value_on(honest, 1, "made")


@pytest.mark.daemons
def test_a_refused_open_leaves_no_session_of_an_honest_older_broker_open(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 1. An older broker (ids of the older form, no owner named) opens "q" for
    the analyst's client, which refuses the id and detaches. It detached by the name "q":
    the broker reads a close as an id, found none, and kept the session open with the
    client attached, holding the name, until its lease ran out (up to a day). Now it
    detaches by the id it was answered with, and the broker closes the session."""
    with rig.connect(session="p") as own:
        monkeypatch.setattr(
            broker_sessions, "session_id", lambda name, owner: f"{name}~{secrets.token_hex(8)}"
        )
        with pytest.raises(AuthenticationError, match="not the one asked for"):
            own.client.open_session("q")
        own.client.listing("sessions")  # on the same socket: after the close, in order
        left = rig.broker.state.sessions.named("q")
        assert left is None, f"left open: {left}"


@pytest.mark.daemons
def test_the_owners_other_client_refuses_an_id_naming_another_owner(rig: Rig) -> None:
    """Finding 2. The analyst's other client attaches to its "p" without ``share_with``;
    the broker (holding mallory's key) answers with mallory's session of the name, which
    mallory shared with the analyst: a member there, the client ran its jobs in a session
    mallory bound, and mallory read their values. Given the owner it means (``owner=``),
    the client refuses an id naming any other, and detaches from it."""
    with rig.connect(session="p"):
        _answer_with(rig, lambda honest: session_id(honest[:-TAIL], "driver:mallory"))
        with pytest.raises(AuthenticationError, match="another owner than 'analyst'"):
            rig.connect(session="p", owner="analyst").close()
        assert rig.tap.alter is None  # the broker did bend it


@pytest.mark.daemons
def test_an_attach_naming_its_owner_joins_that_owners_session_only(rig: Rig) -> None:
    """With an honest broker: the owner's other client (``owner`` its own name) and a
    sharee (``owner`` the sharer's) attach and run; an attach naming another owner than
    the session's is refused, and so is one whose open the broker answers as a new
    session of the attaching driver's own (no such session open yet), which the client
    closes again."""
    with rig.connect(session="p", share_with=["mallory"]) as own:
        with rig.connect(session="p", owner="analyst") as other:
            assert other.session == own.session and _value_on(other, 0, "the analyst's")
        with rig.connect("mallory", session="p", owner="analyst") as sharee:
            assert sharee.session == own.session and _value_on(sharee, 1, "mallory's")
        with pytest.raises(AuthenticationError, match="another owner than 'mallory'"):
            rig.connect(session="p", owner="mallory")
    with pytest.raises(AuthenticationError, match="another owner than 'analyst'"):
        rig.connect("mallory", session="q", owner="analyst")
    wait_until(lambda: rig.broker.state.sessions.named("q") is None, 10, "q to close")


@pytest.mark.daemons
def test_owner_is_checked_in_plaintext_too(tmp_path: Path) -> None:
    """Plaintext ids name their owner too (``driver:<declared name>``), so ``owner=`` is
    checked there as well: a consistency check, not a defence (names are declared)."""
    with mp.local_cluster(2, run_dir=tmp_path) as ctx:
        me, name = ctx.client.driver, ctx.session[:-TAIL]
        other = mp.connect(ctx.address, session=name, driver=me, owner=me)
        with contextlib.closing(other), other:
            assert other.session == ctx.session
        with pytest.raises(AuthenticationError, match="another owner than 'someone'"):
            mp.connect(ctx.address, session=name, driver=me, owner="someone")


# -- the contexts' separators ---------------------------------------------------------------


def test_no_two_fetches_of_one_ticket_read_alike() -> None:
    """Finding 3 (fixed). Written bare, a's fetch of its own value, in a session whose NAME
    holds b's session id and '|rank|', shared its context with a fetch of b's value whose
    uri holds the rest (b's job id chosen so), in b's session shared with a: the broker
    could rewrite the Fetch and a read b's value as its own. The session and uri are now
    each written after its length."""
    theirs = session_id("x", B)  # b's session, shared with a
    mine = session_id(f"{theirs}|0|y", A)  # a's, named after b's id and a rank
    uri = "0123456789abcdef01234567/0"  # a's value, output 0 of its job
    rest = mine[len(theirs) + len("|0|") :]
    forged_uri = f"{rest}|0|{uri}"  # b's job id: f"{rest}|0|0123...", output 0
    assert fetch_context(mine, 0, uri, "t") != fetch_context(theirs, 0, forged_uri, "t")


def _read_fetch_context(context: str) -> tuple[str, int, str, str]:
    """The one way a fetch context reads: each free field after its length."""
    head, rest = context.split("|", 1)
    assert head == "fetch"
    size, rest = rest.split(":", 1)
    session, rest = rest[: int(size)], rest[int(size) :]
    _, rank, rest = rest.split("|", 2)
    size, rest = rest.split(":", 1)
    uri, rest = rest[: int(size)], rest[int(size) :]
    sep, ticket = rest[:1], rest[1:]
    assert sep == "|"
    return session, int(rank), uri, ticket


@pytest.mark.parametrize("name", NAMES)
def test_a_fetch_context_reads_back_as_the_fetch_it_is_of(name: str) -> None:
    for fields in (
        (session_id(name, A), 0, "0123456789abcdef01234567/0", secrets.token_hex(12)),
        (session_id(name, B), 12, f"{name}|3|x/1", "t|5:|"),
        (name, 1, "", ""),
    ):
        assert _read_fetch_context(fetch_context(*fields)) == fields
