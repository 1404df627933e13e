"""Every bound in mpl.wire.limits, each shown to hold (issue 10, bounds on every input)."""

from __future__ import annotations

import math
import tracemalloc
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import zmq
from helpers import decoded_as, double, stats, wait_until
from test_broker_state import D, hello, open_session, program, sent

import mpl.broker.admission as broker_admission
import mpl.wire.limits as limits
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec, GraphBuilder, ProtocolError, RemoteError
from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.data import Fetch
from mpl.wire.jobs import Exec, JobResult, Lit
from mpl.wire.limits import (
    MAX_CONTAINERS,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    MAX_HEADER_ITEMS,
    MAX_LEASE_S,
    MAX_NESTING,
    MAX_SESSIONS,
    BigInt,
    job_timeout,
)
from mpl.wire.record import Record
from mpl.wire.routing import driver_routing_id
from mpl.wire.sessions import Ack, OpenSession, Reply, SaveSymbol, SessionOpened, SymbolInfo
from mpl.worker.keyed_mailbox import move_mailbox

HUGE = 10**5000


def _p(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def _bigint(value: int) -> bytes:
    payload = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
    return bytes(msgpack.packb(msgpack.ExtType(7, payload)))


def _record(tag: str, *fields: bytes) -> list[bytes]:
    return [MAGIC_FRAME, bytes([0x90 + 1 + len(fields)]) + _p(tag) + b"".join(fields)]


@dataclass(eq=False, repr=False)
class _Counter(Record, tag="test-limits-counter"):
    small: int
    big: BigInt


# -- one message ------------------------------------------------------------------------------
def test_ints_in_record_fields_are_64_bit_unless_declared_big() -> None:
    assert decoded_as(_Counter, encode(_Counter((1 << 64) - 1, HUGE))).big == HUGE
    for bad in (1 << 64, -(1 << 63) - 1, HUGE):
        with pytest.raises(ProtocolError, match="field 'small'"):
            decode(_record("test-limits-counter", _bigint(bad), _p(1)))
    with pytest.raises(ProtocolError, match="field 'rank'"):  # a float field is no way round
        decode(_record("hello", _bigint(HUGE), *map(_p, ("i", 1, "h", "a", "", [], "", {}))))
    with pytest.raises(ProtocolError, match="field 'lease_s'"):
        decode(_record("open", _p(1), _p(""), _bigint(HUGE), _p("c"), _p(None), _p(None)))
    assert decoded_as(Lit, encode(Lit(HUGE))).value == HUGE  # values carry ints of any size


def test_nesting_is_bounded_where_decoding_starts() -> None:
    deep = b"\x91" * 600 + b"\x90"
    with pytest.raises(ProtocolError, match=f"nested deeper than {MAX_NESTING}"):
        decode([MAGIC_FRAME, b"\x92" + _p("lit") + deep])
    ok: Any = []
    for _ in range(MAX_NESTING - 5):
        ok = [ok]
    assert decoded_as(Lit, encode(Lit(ok))).value == ok
    too_deep: Any = []
    for _ in range(MAX_NESTING):
        too_deep = [too_deep]
    with pytest.raises(ValueError, match="nested deeper"):  # refused at the sender too
        encode(Lit(too_deep))
    tuples: Any = (1,)
    for _ in range(50):  # tuples are extensions: the same walk counts them
        tuples = (tuples,)
    wide = [[i] for i in range(MAX_NESTING * 3)]  # many containers, shallow: accepted
    assert decoded_as(Lit, encode(Lit([wide, tuples]))).value == [wide, tuples]


def test_a_big_header_of_empty_lists_is_refused_cheaply() -> None:
    items = 2 * 2**20  # 2 MiB of empty lists
    header = b"\x92" + _p("lit") + b"\xdd" + items.to_bytes(4, "big") + b"\x90" * items
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=f"more than {MAX_CONTAINERS} lists"):
            decode([MAGIC_FRAME, header])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, f"rejecting a {len(header) >> 20} MiB header cost {peak >> 20} MiB"
    too_many = MAX_HEADER_ITEMS + 1
    longer = b"\x92" + _p("lit") + b"\xdd" + too_many.to_bytes(4, "big") + b"\x90" * 64
    with pytest.raises(ProtocolError):  # refused before msgpack allocates the list
        decode([MAGIC_FRAME, longer])


def test_a_header_too_big_is_refused_at_the_sender() -> None:
    with pytest.raises(ValueError, match="send bulk data as numpy arrays"):
        encode(Lit([0.5] * (MAX_HEADER_BYTES // 9 + 1)))


def test_frames_per_message_are_bounded() -> None:
    frames = [MAGIC_FRAME, _p(["lit", None]), *([b""] * (MAX_FRAMES + 1))]
    with pytest.raises(ProtocolError, match="too many frames"):
        decode(frames)


# -- requests ---------------------------------------------------------------------------------
def _state() -> BrokerState:
    s = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, broker_id="B")
    s.handle(b"w0", hello(0), 0.0)
    s.handle(b"w1", hello(1), 0.0)
    return s


@pytest.mark.parametrize("lease", [math.nan, math.inf, -math.inf, 0.0, -1.0, MAX_LEASE_S * 2])
def test_leases_outside_one_day_are_refused(lease: float) -> None:
    out = _state().handle(D, OpenSession(1, "", lease, "c1"), 0.0)
    (reply,) = sent(out, Reply, D)
    assert reply.error.kind == "SessionError" and "lease_s" in reply.error.message


def test_a_lease_of_one_day_expires() -> None:
    s = _state()
    sid = open_session(s, lease=MAX_LEASE_S)
    s.tick(MAX_LEASE_S + 1)
    assert s.sessions.get(sid) is None


def test_requests_naming_no_rank_are_refused() -> None:
    s = _state()
    sid = open_session(s)
    prog = program()
    s.handle(D, prog, 0.0)
    out = s.handle(D, Exec(sid, "j1", prog.digest, (), {}), 0.0)
    (result,) = sent(out, JobResult, D)
    assert result.error is not None and "names no rank" in result.error.message
    assert not s.calls.jobs
    info = SymbolInfo("n", "P0", (), True, {})
    out = s.handle(D, SaveSymbol(sid, 5, "j0/0", info), 0.0)
    (reply,) = sent(out, Reply, D)
    assert reply.req == 5 and "names no rank" in reply.error.message
    assert not s.calls.requests


def test_job_timeouts_are_capped_by_the_worker_and_nonsense_refused() -> None:
    assert job_timeout(0.0, 60.0) == 60.0
    assert job_timeout(5.0, 60.0) == 5.0
    assert job_timeout(1e9, 60.0) == 60.0
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="timeout_s"):
            job_timeout(bad, 60.0)


def test_an_infinite_job_timeout_fails_the_job_with_a_clear_error(make_cluster: Any) -> None:
    cluster = make_cluster("inproc")
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    x = b.op("constant", [], ranks=(0,), value=2)[0]
    g = b.build([b.op("pcall", [x], ranks=(0,), fn=b.fn(double))[0]])
    client.submit(sid, g, {}, inline=(0,), timeout=5)  # sends the program

    with pytest.raises((ProtocolError, RemoteError), match="timeout_s"):
        client.submit(sid, g, {}, inline=(0,), timeout=math.inf)


# -- tables keyed by network input --------------------------------------------------------------
def test_sessions_are_bounded() -> None:
    s = _state()
    # each driver may hold 256 sessions (broker/access.py): spread them over many drivers
    drivers = [driver_routing_id(f"d{i}") for i in range(MAX_SESSIONS // 200 + 1)]
    for i in range(MAX_SESSIONS):
        s.handle(drivers[i // 200], OpenSession(i, "", 60.0, "c1"), 0.0)
    last = drivers[-1]
    out = s.handle(last, OpenSession(-1, "", 60.0, "c1"), 0.0)
    assert not sent(out, SessionOpened, last)
    (reply,) = sent(out, Reply, last)
    assert "sessions already" in reply.error.message


def test_moves_for_jobs_that_never_come_are_bounded_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_MOVES_PENDING", 100)
    box = move_mailbox()
    box.open(("s", "j"))  # a real job: its moves skip the holding area (worker/holding.py)
    kept = [box.put(("s", "j", i, 0, 0, ""), i) for i in range(150)]
    assert kept.count(True) == 100 and box.overflow == 50 and box.pending()[0] == 100


def test_hostile_moves_leave_the_worker_serving(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    sid = client.open_session().session
    log = (cluster.impl.run_dir / "worker1.log").read_text()
    data_addr = log.split(" data ", 1)[1].split(",", 1)[0]
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.linger = 2000
        push.connect(data_addr)
        deep = b"\x91" * 600 + b"\x90"
        hostile = [
            _record("move", _p(sid), _p("j"), _bigint(HUGE), _p(0), _p(0), _p(1), _p(1)),
            _record("move", _p(sid), _p("j"), _p(0), _p(0), _p(0), _p(1), deep),
        ]
        for frames in hostile:
            before = stats(client, 1).get("protocol_errors", 0)
            push.send_multipart(frames)

            def counted(b: Any = before) -> Any:
                return stats(client, 1).get("protocol_errors", 0) > b

            wait_until(counted, timeout=15, what="rank 1 to count the bad move")
            client.status(timeout=5.0)
        push.close()
    finally:
        ctx.destroy(linger=0)
    b = GraphBuilder(2)
    x = b.op("constant", [], ranks=(0,), value=7)[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
    z = b.op("pcall", [y], ranks=(1,), fn=b.fn(double))[0]
    assert client.submit(sid, b.build([z]), {}, inline=(0,), timeout=5).values[0] == {1: 14}


def test_calls_in_flight_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_admission, "MAX_CALLS", 3)
    s = _state()
    sid = open_session(s)
    for req in range(3):  # the workers never answer: three fetches stay in flight
        assert sent(s.handle(D, Fetch(sid, req, 0, "j/0"), 0.0), Fetch)
    (reply,) = sent(s.handle(D, Fetch(sid, 9, 0, "j/0"), 0.0), Reply, D)
    assert reply.req == 9 and "calls in flight" in reply.error.message
    prog = program()
    s.handle(D, prog, 0.0)
    (result,) = sent(s.handle(D, Exec(sid, "j9", prog.digest, (0, 1), {}), 0.0), JobResult, D)
    assert result.error is not None and "calls in flight" in result.error.message
    assert len(s.calls.requests) == 3 and not s.calls.jobs


def test_names_per_session_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_admission, "MAX_SESSION_SYMBOLS", 2)
    s = _state()
    sid = open_session(s)
    for i, name in enumerate(("a", "b")):
        (save,) = sent(
            s.handle(D, SaveSymbol(sid, i, "j/0", SymbolInfo(name, "P0", (0,), False, {})), 0.0),
            SaveSymbol,
        )
        s.handle(b"w0", Ack(save.req, 0), 0.0)
    out = s.handle(D, SaveSymbol(sid, 7, "j/0", SymbolInfo("c", "P0", (0,), False, {})), 0.0)
    (reply,) = sent(out, Reply, D)
    assert reply.req == 7 and "names already" in reply.error.message
    assert sent(
        s.handle(D, SaveSymbol(sid, 8, "j/0", SymbolInfo("a", "P0", (0,), False, {})), 0.0),
        SaveSymbol,
    )
