"""Who chooses a session's id (review w28-a finding 1): the broker gives a named session an
id of its name and a fresh random tail, each opening a new one; the driver checks the id it
is answered with names the session it asked for; the broker bounds the name."""

from __future__ import annotations

from test_authz_state import A, open_session, sent

from mpl.broker.admission import MAX_SESSION_NAME
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec
from mpl.wire.session_word import id_of_session_named, session_id
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
    private = session_id("s0123456789abcdef")
    assert id_of_session_named(private, "s0123456789abcdef")
    assert not id_of_session_named(private, "collab")
    assert not id_of_session_named(session_id("trap"), "p")
    assert not id_of_session_named(session_id("p") + "0", "p")
    assert not id_of_session_named(session_id("p~0123456789abcdef"), "p")  # a longer name
    assert not id_of_session_named("p", "p")


def test_the_broker_refuses_a_session_name_beyond_its_bound() -> None:
    s = _state()
    long = "n" * (MAX_SESSION_NAME + 1)
    out = s.handle(A, OpenSession(7, long, 60.0, "c"), 0.0)
    (reply,) = sent(out, Reply, A)
    assert reply.error is not None and reply.error.kind == "SessionError"
    assert not s.sessions.by_id
    assert id_of_session_named(open_session(s, A, long[1:]), long[1:])
