"""The broker's hot path: an Exec travels as the bytes it came in; the answer to a job whose
Dones it read lean is packed from the values it read (``mpl.wire.hot.packed_result``).

A real broker (in-process, on a free loopback port) with raw DEALER sockets for the workers
and the driver: the test writes the workers' answers by hand (their value in a wide int), so
it can tell a verbatim copy from what was packed anew, and it counts what each socket gets.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from helpers import decoded_as, joined_workers, raw_broker, session_with_program

from mpl.broker.daemon import Broker
from mpl.wire import Graph, GraphBuilder
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, decode, encode, from_wire, to_wire
from mpl.wire.control import Heartbeat
from mpl.wire.hot_spans import done_spans, execs_for_ranks, result_frames
from mpl.wire.jobs import Done, Exec, JobResult, Lit
from mpl.wire.record import Record
from mpl.wire.run_stats import pack_stats
from mpl.wire.sessions import (
    ListRequest,
    Reply,
    StatusRequest,
    SymbolInfo,
)

# 1 as a uint64 (0xcf + 8 bytes): msgpack itself would write the one byte 0x01, so only a
# copy of the worker's bytes keeps this form
WIDE_ONE = b"\xcf" + (1).to_bytes(8, "big")


class Raw:
    def __init__(self, ctx: zmq.Context[Any], address: str) -> None:
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, msg: Record) -> None:
        self.sock.send_multipart(to_wire(encode(msg)))

    def next(self, timeout: float = 10.0) -> list[bytes] | None:
        if self.sock.poll(int(timeout * 1000)):
            return from_wire(self.sock.recv_multipart())
        return None

    def wait_for(self, kind: type[Record], timeout: float = 10.0) -> tuple[Record, list[bytes]]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            frames = self.next(left)
            if frames is not None and isinstance(msg := decode(frames, unpickle=False), kind):
                return msg, frames
        raise AssertionError(f"no {kind.__name__} in time")

    def drain(self, seconds: float) -> list[Record]:
        """Everything that arrives within ``seconds`` (a bound on what may still come)."""
        got: list[Record] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            frames = self.next(left)
            if frames is not None:
                got.append(decode(frames, unpickle=False))
        return got


@pytest.fixture
def rig() -> Iterator[tuple[Broker, Any]]:
    """A broker for 3 ranks, and a maker of raw sockets on it (all closed at the end)."""
    with raw_broker(3, Raw) as pair:
        yield pair


def _done_by_hand(session: str, job: str, rank: int) -> list[bytes]:
    """A Done with value 1 written as WIDE_ONE, and empty stats, metas and saved names."""
    pack = msgpack.packb
    header = b"".join(
        (b"\x98", pack("done"), pack(session), pack(job), pack(rank), b"\x81", pack(0), WIDE_ONE)
    )
    return [MAGIC_FRAME, header + pack(b"") + pack({}) + pack([])]


def test_done_values_reach_the_driver_as_read_and_each_rank_gets_one_exec(
    rig: tuple[Broker, Any],
) -> None:
    _, raw = rig
    workers = joined_workers(raw, 3)
    driver, session, digest = session_with_program(raw, "hot", 3, (0, 1, 2))
    # bindings for two ranks: each must get only its own, cut out of the driver's header
    bindings: dict[int, Any] = {0: [Lit("zero")], 2: [Lit("two")]}
    driver.send(Exec(session, "hot-job", digest, (0, 1, 2), bindings, (0,)))
    for rank, w in enumerate(workers):
        exe, _ = w.wait_for(Exec)
        assert isinstance(exe, Exec)
        assert exe.bindings == ({rank: bindings[rank]} if rank in bindings else {})
        w.sock.send_multipart(to_wire(_done_by_hand(session, "hot-job", rank)))
    result, frames = driver.wait_for(JobResult)
    assert isinstance(result, JobResult) and result.error is None
    assert result.values == {0: {0: 1, 1: 1, 2: 1}}
    # packed from what the broker read (plain msgpack: the same values, the shortest form)
    assert frames[1].count(WIDE_ONE) == 0
    # one Exec per rank for the job, and nothing else about it
    for w in workers:
        late = [m for m in w.drain(0.3) if isinstance(m, Exec)]
        assert late == []


def test_spliced_result_decodes_as_the_encoded_one() -> None:
    d0 = Done("s", "j", 0, {0: 1, 2: [1, "x", (2, 3)]}, pack_stats(0.01, 1.5, []), {0: "i"})
    d1 = Done("s", "j", 1, {0: 2.5, 2: None}, pack_stats(0.02, 1.6, [[0, "x", 0, 1]]), {2: "x"})
    values: dict[int, dict[int, bytes]] = {}
    stats: dict[int, bytes] = {}
    for rank, done in enumerate((d0, d1)):
        spans = done_spans(encode(done))
        assert spans is not None
        for index, raw in spans.values.items():
            values.setdefault(index, {})[rank] = raw
        stats[rank] = spans.stats
    frames = result_frames("j", values, stats, {0: "i", 2: "x"})
    assert frames is not None
    want = JobResult(
        "j",
        {0: {0: 1, 1: 2.5}, 2: {0: [1, "x", (2, 3)], 1: None}},
        stats={0: d0.stats, 1: d1.stats},
        metas={0: "i", 2: "x"},
    )
    assert decode(frames) == want


@pytest.mark.parametrize("job", ["", "j", "j" * 31, "j" * 32, "é" * 16, "j" * 300])
def test_spliced_result_packs_any_job_id_as_the_codec_does(job: str) -> None:
    """The job id is packed by hand when short (no Packer made): byte for byte what the
    codec writes, on both sides of the short form's limit (31 bytes of UTF-8)."""
    blob = pack_stats(0.5, 1.0, [])
    spans = done_spans(encode(Done("s", job, 0, {0: 7}, blob, {0: "int64[]"})))
    assert spans is not None
    frames = result_frames(job, {0: {0: spans.values[0]}}, {0: spans.stats}, {0: "int64[]"})
    assert frames is not None
    want = JobResult(job, {0: {0: 7}}, stats={0: blob}, metas={0: "int64[]"})
    assert frames[1] == encode(want)[1]
    assert decode(frames) == want


def test_messages_with_buffer_frames_take_the_ordinary_path() -> None:
    big = np.arange(10_000)  # travels in a frame of its own
    assert done_spans(encode(Done("s", "j", 0, {0: big}))) is None
    assert execs_for_ranks(encode(Exec("s", "j", "d", (0, 1), {0: [Lit(big)]})), (0, 1)) is None
    small = execs_for_ranks(encode(Exec("s", "j", "d", (0, 1), {0: [Lit(3)]}, (0,), 1.5)), (1,))
    assert small is not None
    assert decode(small[0]) == Exec("s", "j", "d", (0, 1), {}, (0,), 1.5)


def test_an_unexpected_layout_leaves_the_next_message_readable() -> None:
    """A header that is not the layout expected is refused without spoiling the reader
    kept for the next one (it holds what it was fed)."""
    assert done_spans([MAGIC_FRAME, msgpack.packb(["done", "s", "j", 0, {0: 1}])]) is None
    assert done_spans([MAGIC_FRAME, msgpack.packb([1, 2, 3, 4, 5, 6, 7, 8])]) is None
    spans = done_spans(encode(Done("s", "j", 0, {3: "v"})))
    assert spans is not None and spans.values == {3: msgpack.packb("v")}


def test_the_broker_handles_every_queued_message_before_its_timers() -> None:
    """A worker's heartbeat queued behind other messages must count before the silence
    check runs: the timers wait until the queue is drained (a broker that was descheduled
    for a while must not declare the worker that kept talking lost)."""
    ctx: zmq.Context[Any] = zmq.Context()
    broker = Broker(ClusterSpec.simple(2), "inproc://hot-turn", context=ctx)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(broker.address)
        beat = encode(Heartbeat())
        for _ in range(3):  # inproc: queued at the broker once send returns
            sock.send_multipart(to_wire(beat))
        routed_at_tick: list[int] = []
        tick = broker.state.tick

        def spy(now: float) -> list[Any]:
            routed_at_tick.append(broker.state.counters["bytes_routed"])
            return tick(now)

        broker.state.tick = spy  # type: ignore[method-assign]
        broker._turn(0.0)
        assert routed_at_tick == [3 * sum(len(f) for f in beat)]
    finally:
        sock.close(linger=0)
        broker.close()
        ctx.term()


def test_a_workers_forged_save_claims_over_the_wire_name_nothing(
    rig: tuple[Broker, Any],
) -> None:
    """Rank 1 of a job claims, in its Done, names it could not have written: another
    rank's file, a path for a name, a value it shares with rank 0 that rank 0 never
    reported. Nothing is named, each claim is counted, and the job and broker go on."""
    _, raw = rig
    workers = joined_workers(raw, 3)
    driver, session, digest = session_with_program(raw, "claims", 3, (0, 1))
    driver.send(Exec(session, "claims-job", digest, (0, 1), {}, ()))
    for w in workers[:2]:
        w.wait_for(Exec)
    claims = [
        SymbolInfo("theirs", "P0", (0,), True, {}),
        SymbolInfo("../up", "P1", (1,), True, {}),
        SymbolInfo("half", "", (0, 1), False, {}),
    ]
    workers[1].send(Done(session, "claims-job", 1, saved=claims))
    workers[0].send(Done(session, "claims-job", 0))
    result, _ = driver.wait_for(JobResult)
    assert isinstance(result, JobResult) and result.error is None
    driver.send(ListRequest(2, "symbols", session))
    listing, _ = driver.wait_for(Reply)
    assert isinstance(listing, Reply) and listing.error is None
    assert listing.value == {"session": [], "persisted": []}
    driver.send(StatusRequest(3))
    status, _ = driver.wait_for(Reply)
    assert isinstance(status, Reply) and status.value["forged_replies"] == 3


def test_an_exec_without_bindings_reaches_every_rank_as_the_drivers_bytes(
    rig: tuple[Broker, Any],
) -> None:
    """The fan-out sends the frames that arrived to every rank: a header the codec would
    write differently (timeout_s as a 4-byte float) reaches all three ranks unchanged, and
    each decodes to the driver's Exec."""
    _, raw = rig
    workers = joined_workers(raw, 3)
    driver, session, digest = session_with_program(raw, "fan", 3, (0, 1, 2))
    exe = Exec(session, "fan-job", digest, (0, 1, 2), {}, (0,), 1.5)
    header = encode(exe)[1]
    single = msgpack.packb(1.5, use_single_float=True)  # 0xca + 4 bytes
    assert header.endswith(msgpack.packb(1.5))
    hand = header[: -len(msgpack.packb(1.5))] + single
    driver.sock.send_multipart(to_wire([MAGIC_FRAME, hand]))
    for rank, w in enumerate(workers):
        got, frames = w.wait_for(Exec)
        assert frames[1] == hand, f"rank {rank} got a re-encoded Exec"
        assert got == exe
        w.sock.send_multipart(to_wire(_done_by_hand(session, "fan-job", rank)))
    result, _ = driver.wait_for(JobResult)
    assert isinstance(result, JobResult) and result.values == {0: {0: 1, 1: 1, 2: 1}}


def test_a_done_from_another_ranks_socket_is_dropped_and_the_job_waits_for_the_rank(
    rig: tuple[Broker, Any],
) -> None:
    """Rank 0's socket, and a raw socket that never registered, answer for rank 1: both
    Dones are dropped (the sender is the socket, not the rank field; rank 0's is counted
    as forged, the stranger's noted), and the result carries rank 1's own value once rank
    1 answers."""
    _, raw = rig
    workers = joined_workers(raw, 3)
    driver, session, digest = session_with_program(raw, "forged", 3, (0, 1, 2))
    driver.send(Exec(session, "forged-job", digest, (0, 1), {}, (0,)))
    for w in workers[:2]:
        w.wait_for(Exec)
    forged = Done(session, "forged-job", 1, {0: "forged"})
    stranger = raw()
    stranger.send(forged)
    workers[0].send(forged)
    workers[0].sock.send_multipart(to_wire(_done_by_hand(session, "forged-job", 0)))
    assert driver.drain(0.3) == []  # rank 1 has not answered: no result yet
    workers[1].sock.send_multipart(to_wire(_done_by_hand(session, "forged-job", 1)))
    result, _ = driver.wait_for(JobResult)
    assert isinstance(result, JobResult) and result.error is None
    assert result.values == {0: {0: 1, 1: 1}}
    driver.send(StatusRequest(3))
    status, _ = driver.wait_for(Reply)
    assert isinstance(status, Reply) and status.value["forged_replies"] == 1
    assert any("not a registered worker" in e for e in status.value["errors"])


def test_built_makes_the_record_its_init_makes_and_refuses_a_wrong_field_count() -> None:
    from mpl.wire.record import built

    stats = {0: pack_stats(1.0, 0.0, [])}
    made = built(JobResult, "j", {0: {0: 1}}, None, False, stats, {0: "int64[]"})
    want = JobResult("j", {0: {0: 1}}, stats=stats, metas={0: "int64[]"})
    assert type(made) is JobResult and made == want
    assert decode(encode(made)) == want
    with pytest.raises(Exception, match="cannot assign"):
        made.job = "other"
    with pytest.raises(TypeError, match="6 fields, got 2"):
        built(JobResult, "j", {})


@dataclasses.dataclass(eq=False, repr=False)
class Checked(Record, tag="test-pinned-checked"):
    """A record that does more on construction than store its field."""

    x: int

    def __post_init__(self) -> None:
        pass


def test_pinned_fields_refuses_a_changed_layout_or_a_record_that_does_more() -> None:
    from mpl.wire.record import pinned_fields

    fields = ("job", "values", "error", "missing_program", "stats", "metas")
    assert pinned_fields(JobResult, fields, "t", direct=True) == fields
    with pytest.raises(ImportError, match="t: JobResult's fields changed"):
        pinned_fields(JobResult, fields[:-1], "t")

    assert pinned_fields(Checked, ("x",), "t") == ("x",)
    with pytest.raises(ImportError, match="t: Checked does more on construction"):
        pinned_fields(Checked, ("x",), "t", direct=True)


def test_replaced_copies_a_record_with_fields_swapped_and_leaves_the_original() -> None:
    from mpl.wire.record import replaced

    exe = Exec("s", "j", "d", (0, 1), {0: [Lit(1)], 1: [Lit(2)]}, (0,), 2.0)
    mine = replaced(exe, bindings={1: [Lit(2)]})
    assert mine == Exec("s", "j", "d", (0, 1), {1: [Lit(2)]}, (0,), 2.0)
    assert exe.bindings == {0: [Lit(1)], 1: [Lit(2)]}
    assert decode(encode(mine)) == mine
    with pytest.raises(TypeError, match="no field 'bindingz'"):
        replaced(exe, bindingz={})
    with pytest.raises(Exception, match="cannot assign"):
        mine.job = "other"
    # a value cached from the fields (a graph's wire digest) is not carried to the copy
    b = GraphBuilder(1)
    graph = decoded_as(Graph, encode(b.build(b.op("constant", [], ranks=(0,), value=1))))
    assert "digest" in graph.__dict__
    assert "digest" not in replaced(graph, outputs=graph.outputs).__dict__


def test_a_malformed_done_on_the_lean_path_is_refused_and_the_job_still_waits(
    rig: tuple[Broker, Any],
) -> None:
    """Dones that begin as a Done header (so the broker reads them without building the
    record) but carry a bad field, bytes past the header, or a rank's stranger socket: each
    is refused or dropped, none ends the job; rank 1's own answer then does."""
    from mpl.wire.control import Refused

    _, raw = rig
    workers = joined_workers(raw, 3)
    driver, session, digest = session_with_program(raw, "lean", 3, (0, 1, 2))
    driver.send(Exec(session, "lean-job", digest, (0, 1), {}, (0,)))
    for w in workers[:2]:
        w.wait_for(Exec)
    workers[0].sock.send_multipart(to_wire(_done_by_hand(session, "lean-job", 0)))
    pack = msgpack.packb
    bad_rank = [MAGIC_FRAME, pack(["done", session, "lean-job", "1", {0: 1}, {}, {}, []])]
    bad_meta = [MAGIC_FRAME, pack(["done", session, "lean-job", 1, {0: 1}, {}, {0: 7}, []])]
    trailing = _done_by_hand(session, "lean-job", 1)
    trailing[1] += b"\xc0"
    for frames in (bad_rank, bad_meta, trailing):
        assert frames[1].startswith(b"\x98\xa4done")
        workers[1].sock.send_multipart(to_wire(frames))
        refused, _ = workers[1].wait_for(Refused)
        assert isinstance(refused, Refused) and refused.error.kind == "ProtocolError"
    workers[2].sock.send_multipart(to_wire(_done_by_hand(session, "lean-job", 1)))  # not rank 1's
    assert driver.drain(0.3) == []
    workers[1].sock.send_multipart(to_wire(_done_by_hand(session, "lean-job", 1)))
    result, frames = driver.wait_for(JobResult)
    assert isinstance(result, JobResult) and result.error is None
    assert result.values == {0: {0: 1, 1: 1}}
    driver.send(StatusRequest(3))
    status, _ = driver.wait_for(Reply)
    assert isinstance(status, Reply) and status.value["forged_replies"] == 1
    assert status.value["protocol_errors"] >= 3
