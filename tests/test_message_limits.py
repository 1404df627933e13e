"""A message over a limit fails at once with ``MessageTooLargeError``, on real daemons.

libzmq drops a frame over a socket's MAXMSGSIZE (``--max-message``) together with the
connection. Before: the driver's oversized Exec left the job to wait out its deadline
(``MplTimeoutError``); a worker's oversized fetch answer closed its connection
(``WorkerLostError``); an oversized move left the receiving rank waiting
(``RemoteError`` wrapping ``MplTimeoutError``); a fetched list of millions of items kept the
worker's I/O thread encoding past the broker's patience (``WorkerLostError``, the worker gone
for good); a call on a long Python list built one job input per item (seconds per 100,000)
and then an Exec past the limit. The broker now announces its limit (``SessionOpened``,
``Welcome``); the driver and the workers refuse what would not be taken, saying which limit
and what to do. The cluster's job deadline is 30 s: a regression fails by it, as before.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

import mpl.driver as mp
from mpl.wire import MessageTooLargeError, MplTimeoutError, RemoteError, WorkerLostError
from mpl.wire.codec import pickle_by_value
from mpl.wire.control import Heartbeat

pytestmark = pytest.mark.daemons

LIMIT = 64 * 1024
BIG = 100_000  # bytes: over LIMIT


def make_bytes(n: int) -> bytes:
    return b"x" * n


def make_list(n: int) -> list[int]:
    return list(range(n))


def nested_bytes(n: int) -> list[list[bytes]]:
    """Over LIMIT once encoded, yet no single level of it looks long (no estimate sees it)."""
    return [[b"y" * 1000 for _ in range(n // 1000 // 10)] for _ in range(10)]


def size_of(x: Any) -> int:
    return len(x)


def total(xs: list[int]) -> int:
    return sum(xs)


pickle_by_value(sys.modules[__name__])  # the workers do not have the tests package


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    limit = ("--max-message", str(LIMIT))
    run_dir = tmp_path_factory.mktemp("limits")
    with mp.local_cluster(2, run_dir=run_dir, broker_args=limit, worker_args=limit) as ctx:
        ctx.client.job_timeout = 30.0
        yield ctx


def _still_serving(ctx: Any) -> None:
    """The session still serves: both ranks up, each answering a small job."""
    rows = ctx.client.status(timeout=30)["ranks"]
    assert sorted((row["rank"], row["state"]) for row in rows) == [(0, "up"), (1, "up")]
    assert mp.fetch(mp.device("P0")(size_of)(b"abc"), timeout=30) == 3
    assert mp.fetch(mp.device("P1")(size_of)(b"abcd"), timeout=30) == 4


def test_the_broker_announces_its_limit(small: Any) -> None:
    assert small.client.max_message == LIMIT


def test_an_exec_over_the_brokers_limit_is_refused_before_it_is_sent(small: Any) -> None:
    with pytest.raises(MessageTooLargeError, match="--max-message") as err:
        mp.fetch(mp.device("P0")(size_of)(b"y" * BIG), timeout=30)
    assert err.value.limit == LIMIT and err.value.size > LIMIT
    assert "mpl.io" in str(err.value) and "the broker" in str(err.value)
    _still_serving(small)


def test_an_async_exec_over_the_limit_fails_its_future(small: Any) -> None:
    from mpl.wire.graph import GraphBuilder
    from mpl.wire.jobs import Lit

    b = GraphBuilder(2)
    x = b.input((0,))
    y = b.op("pcall", [x], ranks=(0,), fn=b.fn(size_of))[0]
    graph = b.build([y])
    future = small.client.submit_async(small.session, graph, {0: [Lit(b"z" * BIG)]})
    with pytest.raises(MessageTooLargeError, match="--max-message"):
        future.result(60)
    _still_serving(small)


def test_a_fetched_value_over_the_limit_fails_the_fetch_not_the_worker(small: Any) -> None:
    value = mp.device("P0")(make_bytes)(BIG)
    with pytest.raises(MessageTooLargeError, match="--max-message") as err:
        mp.fetch(value, timeout=30)
    assert not isinstance(err.value, WorkerLostError)
    nested = mp.device("P0")(nested_bytes)(BIG)  # refused once encoded, not by the estimate
    with pytest.raises(MessageTooLargeError, match="the answer to a fetch"):
        mp.fetch(nested, timeout=30)
    _still_serving(small)


def test_a_move_over_the_limit_fails_the_job(small: Any) -> None:
    value = mp.device("P0")(make_bytes)(BIG)
    with pytest.raises(MessageTooLargeError, match="move from rank 0 to rank 1") as err:
        mp.fetch(mp.device("P1")(size_of)(value), timeout=30)
    assert not isinstance(err.value, (RemoteError, MplTimeoutError))
    _still_serving(small)


def test_a_fetched_list_of_millions_fails_by_its_estimate(small: Any) -> None:
    """5 million items: at least 5 MB encoded, refused before the worker walks it."""
    with pytest.raises(MessageTooLargeError, match="at least 5,000,000 bytes"):
        mp.fetch(mp.device("P0")(make_list)(5_000_000), timeout=30)
    _still_serving(small)


def test_a_fetched_list_of_millions_is_encoded_off_the_io_thread(tmp_path: Any) -> None:
    """Default limits: 5 million ints pass the size estimate, and encoding them (seconds)
    ends past the 16 MiB header bound. On a job thread: the I/O thread heartbeats
    meanwhile, the fetch fails naming the bound, the worker stays (before: encoded on the
    I/O thread, the broker took the silent worker for lost: WorkerLostError, for good)."""
    with mp.local_cluster(2, run_dir=tmp_path) as ctx:
        ctx.client.job_timeout = 60.0
        value = mp.device("P0")(make_list)(5_000_000)
        with pytest.raises(MessageTooLargeError, match="exceeds 16777216"):
            mp.fetch(value, timeout=60)
        _still_serving(ctx)


def test_a_long_python_list_argument_is_one_input(small: Any) -> None:
    """50,000 ints in a list: one job input (its Exec within the limit: small ints take a
    byte each), not 50,000 (a program of about a megabyte, past the limit)."""
    xs = [i % 100 for i in range(50_000)]
    assert mp.fetch(mp.device("P0")(total)(xs), timeout=30) == sum(xs)
    # plain data nested in a tuple and a dict too
    pairs = ([(1, "a")] * 2000, {"k": [None, 2.5] * 1000})
    assert mp.fetch(mp.device("P0")(size_of)(pairs), timeout=30) == 2


def test_a_program_over_the_limit_is_refused_before_it_is_sent(small: Any) -> None:
    blob = b"q" * BIG

    def captured() -> int:  # its program carries the bytes it closes over
        return len(blob)

    with pytest.raises(MessageTooLargeError, match="'program' message"):
        mp.fetch(mp.device("P0")(captured)(), timeout=30)
    _still_serving(small)


# -- a broker's word: its announced limit, its answers ---------------------------------------
def _fake_broker(announced: int, stats: bytes = b"") -> Any:
    """A broker that opens sessions announcing ``announced`` as its limit, answers every
    Exec (``stats`` as rank 0's blob) and every heartbeat."""
    from test_red32_driver_text import FakeBroker

    from mpl.wire.cluster import ClusterSpec
    from mpl.wire.control import Heartbeat
    from mpl.wire.jobs import Exec, JobResult
    from mpl.wire.record import Record
    from mpl.wire.session_word import session_id
    from mpl.wire.sessions import OpenSession, SessionOpened

    def answer(msg: Record) -> list[Record]:
        if isinstance(msg, Heartbeat):
            return [Heartbeat()]
        if isinstance(msg, OpenSession):
            sid = session_id(msg.name, "driver:d")
            spec = ClusterSpec.simple(2).to_dict()
            return [SessionOpened(msg.req, sid, "b", spec, 1.0, False, {}, announced)]
        if isinstance(msg, Exec):
            return [JobResult(msg.job, {0: {0: 7}}, None, False, {0: stats}, {})]
        return []

    return FakeBroker(answer)


def _one_job(bytes_in: int) -> tuple[Any, dict[int, list[Any]]]:
    from mpl.wire.graph import GraphBuilder
    from mpl.wire.jobs import Lit

    b = GraphBuilder(2)
    x = b.input((0,))
    y = b.op("pcall", [x], ranks=(0,), fn=b.fn(size_of))[0]
    return b.build([y]), {0: [Lit(b"w" * bytes_in)]}


@pytest.mark.parametrize(
    ("announced", "taken"), [(0, 1024), (-(1 << 63), 1024), (1 << 63, 1 << 63), (5000, 5000)]
)
def test_a_brokers_announced_limit_is_bounded(announced: int, taken: int) -> None:
    """The broker's figure is its word: below ``MIN_MAX_MESSAGE`` (the least the daemons
    take) it counts as that, above anything it only lets everything be sent; either way
    small jobs run, and a job over it is refused here, never sent."""
    from mpl.driver.client import Client
    from mpl.wire.limits import MIN_MAX_MESSAGE

    assert MIN_MAX_MESSAGE == 1024
    broker = _fake_broker(announced)
    client = Client(f"tcp://127.0.0.1:{broker.port}", timeout=10.0, job_timeout=20.0)
    try:
        client.open_session("s")
        assert client.max_message == taken
        graph, small_in = _one_job(10)
        assert client.submit("s", graph, small_in).values == {0: {0: 7}}
        _, big_in = _one_job(6000)
        if taken < 6000:
            with pytest.raises(MessageTooLargeError, match=f"{taken:,}-byte limit"):
                client.submit("s", graph, big_in)
        else:
            assert client.submit("s", graph, big_in).values == {0: {0: 7}}
    finally:
        client.close()
        broker.close()


def test_an_answer_refused_for_its_stats_fails_its_job_at_once() -> None:
    """A broker's JobResult with stats over ``MAX_STATS_BYTES`` is refused on reading (R32-4);
    the job waiting for it fails then, naming why, for a waiting call and a future alike
    (before: each waited out its deadline for an answer that had come)."""
    from mpl.driver.client import Client
    from mpl.wire import ProtocolError
    from mpl.wire.run_stats import MAX_STATS_BYTES

    broker = _fake_broker(LIMIT, stats=b"\x94" + b"s" * MAX_STATS_BYTES)
    client = Client(f"tcp://127.0.0.1:{broker.port}", timeout=10.0, job_timeout=20.0)
    try:
        client.open_session("s")
        graph, bindings = _one_job(10)
        with pytest.raises(ProtocolError, match="the answer could not be accepted"):
            client.submit("s", graph, bindings)
        future = client.submit_async("s", graph, bindings)
        with pytest.raises(ProtocolError, match="the answer could not be accepted"):
            future.result(60)
    finally:
        client.close()
        broker.close()


def test_a_refused_answers_job_is_read_from_its_head_alone() -> None:
    from mpl.wire.codec import encode
    from mpl.wire.jobs import JobResult
    from mpl.wire.result_read import refused_answer_job

    for job in ("a" * 24, "j", "x" * 40):  # a fixstr, and a str 8 past 31 characters
        frames = encode(JobResult(job, {}, None, False, {}, {}))
        assert refused_answer_job(frames) == job
        assert refused_answer_job([frames[0], frames[1][:-3]]) == job  # the rest unread
        cut = frames[1].index(job.encode()) + len(job) - 1
        assert refused_answer_job([frames[0], frames[1][:cut]]) is None  # the id cut short
        assert refused_answer_job([b"MPL\x03", frames[1]]) is None  # another version
    assert refused_answer_job(encode(Heartbeat())) is None


class _Sent:
    """A look-alike socket that keeps what is sent on it."""

    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
        self.sent.append(list(frames))


def test_an_inline_done_over_the_limit_goes_as_its_jobs_failure() -> None:
    """The job shell's own packed Done (an inline run's; in secure mode its values sealed
    already) over the broker's limit: its job's Failed goes instead, never sealed again."""
    import threading

    from mpl.wire.codec import decode, from_wire
    from mpl.wire.done_pack import own_done_fields
    from mpl.wire.jobs import Failed
    from mpl.worker.result_channel import ResultChannel

    channel: Any = ResultChannel()
    results = _Sent()
    channel.__dict__.update(
        rank=1,
        seal=None,
        _results=results,
        _results_lock=threading.Lock(),
        _closed=False,
        _io_thread=-1,  # not this thread
        _gathered=None,
        _send_limit=1024,
    )
    frames = own_done_fields("s", "job-7", 1, {0: list(range(2000))}, b"", {0: "list"})
    assert frames is not None and len(frames[1]) > 1024
    channel._post_done_frames(frames)
    (sent,) = results.sent
    failed = decode(from_wire(sent))
    assert isinstance(failed, Failed) and (failed.job, failed.rank) == ("job-7", 1)
    assert failed.error.kind == "MessageTooLargeError"
    assert "1,024-byte limit" in failed.error.message
