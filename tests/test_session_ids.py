"""Who chooses a session's id (review w28-a finding 1): the broker gives a named session an
id of its name and a fresh random tail, each opening a new one; the driver checks the id it
is answered with names the session it asked for; the broker bounds the name."""

from __future__ import annotations

from test_authz_state import A, open_session, sent

from mpl.broker.admission import MAX_SESSION_NAME
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec
from mpl.wire.seal import _INDEX_AADS
from mpl.wire.seal_contexts import done_context
from mpl.wire.session_word import binds_owner, id_of_session_named, session_id
from mpl.wire.sessions import OpenSession, Reply


def _state() -> BrokerState:
    return BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")


def test_a_named_sessions_id_is_its_name_and_a_tail_new_at_each_opening() -> None:
    s = _state()
    first = open_session(s, A, "p")
    assert id_of_session_named(first, "p")
    assert open_session(s, A, "p") == first  # attached: the same session
    s.sessions.remove(first)  # closed
    again = open_session(s, A, "p")
    assert id_of_session_named(again, "p") and again != first  # workers remember ``first``


def test_an_id_of_another_name_is_not_the_asked_sessions() -> None:
    private = session_id("s0123456789abcdef", "driver:a")
    assert id_of_session_named(private, "s0123456789abcdef")
    assert not id_of_session_named(private, "collab")
    assert not id_of_session_named(session_id("trap", "driver:a"), "p")
    assert not id_of_session_named(session_id("p", "driver:a") + "0", "p")
    longer = session_id("p~0123456789abcdef01234567", "driver:a")  # a name that reads as one
    assert not id_of_session_named(longer, "p")
    assert not id_of_session_named("p", "p")
    assert not id_of_session_named("p~0123456789abcdef", "p")  # an older broker's id


def test_a_sessions_id_names_its_owner_to_every_worker_and_driver() -> None:
    """Review w29-a finding 3: the id the broker gives a session commits to the driver
    that opened it, so a worker lets no other driver bind it (``binds_owner``) and the
    owner's driver knows it opened its own. Another driver's tag never reads as the
    owner's: not for another name, nor with the tail moved onto the name."""
    sid = session_id("proj", "driver:a")
    assert binds_owner(sid, "driver:a")
    assert not binds_owner(sid, "driver:b") and not binds_owner(sid, "driver:aa")
    other = session_id("proj", "driver:b")
    assert not binds_owner(other, "driver:a")  # b's own "proj" is not a's
    assert not binds_owner(sid[:5] + other[5:], "driver:a")  # b's tail on a's name
    assert not binds_owner(sid[:-1] + ("A" if sid[-1] != "A" else "B"), "driver:a")
    assert not binds_owner("x" + sid, "driver:a")  # another name, the same tail
    assert len({session_id("proj", "driver:a") for _ in range(64)}) == 64  # new each time
    # an id of no owner (an older broker's form, a test's plain name) binds to whoever
    # seals first, as before: no driver of this kind acts in one (id_of_session_named)
    assert binds_owner("proj~0123456789abcdef", "driver:b") and binds_owner("sa", "driver:b")


def test_the_broker_names_each_sessions_owner_in_its_id() -> None:
    s = _state()
    named, unnamed = open_session(s, A, "p"), open_session(s, A, "")
    for sid in (named, unnamed):
        assert binds_owner(sid, s.sessions.by_id[sid].owner)
        assert not binds_owner(sid, "driver:mallory")


def test_the_broker_refuses_a_session_name_beyond_its_bound() -> None:
    s = _state()
    long = "n" * (MAX_SESSION_NAME + 1)
    out = s.handle(A, OpenSession(7, long, 60.0, "c"), 0.0)
    (reply,) = sent(out, Reply, A)
    assert reply.error is not None and reply.error.kind == "SessionError"
    assert not s.sessions.by_id
    assert id_of_session_named(open_session(s, A, long[1:]), long[1:])


def test_a_trivial_jobs_answer_box_tag_input_fits_one_blake2b_block() -> None:
    """A Done's context writes the session out (``done|session|job|index``). A compact
    box's tag is BLAKE2b over its 32-byte key, its nonce, the plaintext's length, the
    ciphertext and the associated data (``mpl.wire.seal_box``): one compression while they
    fit one 128-byte block. With the owner's tag in the id they still fit for a trivial
    job's one-byte answer (and a sealed None of it) in a session a driver named itself,
    output 0 to 9: a hex tag, 16 characters longer, took them to two."""
    sid = session_id("s" + "5" * 16, "driver:alice")  # a driver's own name, its id
    start = done_context(sid, "a" * 24, 0)[:-1].encode()  # a driver's job id (_JobIds)
    for index in range(10):
        aad = start + _INDEX_AADS[index]
        assert 32 + 12 + 1 + 1 + len(aad) <= 128  # key, nonce, length, ciphertext, aad
        assert 32 + 12 + len(start) + len(str(index)) <= 128  # a sealed None's tag
