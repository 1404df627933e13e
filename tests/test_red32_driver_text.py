"""Third red team w32: what a hostile broker (or a party's worker, through an honest broker)
can make a driver keep and print.

A driver decodes, before anything authenticates it, what the broker writes in the clear:
progress reports, the status table, the text of errors. These tests fake the broker with a
raw ROUTER socket (loopback, plaintext: in secure mode these are the broker's own headers,
not sealed, so the same holds with its key) and check that:

* R32-1: ``Progress`` reports cannot grow the driver's progress board without bound (one
  entry per ``rank`` the report names, any int), and their ``op`` text reaches the tqdm bar
  (drawn straight to the terminal) and ``ctx.status()`` escaped and cut short;
* R32-2: text in the status table (a worker's host, recent errors) and in a raised error
  (message, op, remote type, traceback) is escaped when printed: an ESC or OSC sequence
  there drove the reader's terminal (rewrote lines, set the title, wrote the clipboard).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from mpl.driver.client import Client
from mpl.driver.job_progress import MAX_BOARD_RANKS
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.errors import RemoteError
from mpl.wire.graph import Graph
from mpl.wire.jobs import Exec
from mpl.wire.printable import MAX_LINE_CHARS
from mpl.wire.progress import Progress
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import Reply, StatusRequest
from mpl.wire.status import format_status

_ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[1A\x1b]52;c;ZWNobyBvd25lZA==\x07\u202e"
_DEADLINE_S = 20.0


class FakeBroker:
    """A ROUTER on loopback that answers the driver by ``answer(msg) -> [records]``."""

    def __init__(self, answer: Callable[[Record], list[Record]]) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.answer = answer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(20):
                continue
            peer, *frames = self.router.recv_multipart()
            try:
                msg = decode(from_wire(frames), unpickle=False)
            except Exception:  # a fake broker ignores what it cannot read
                continue
            for out in self.answer(msg):
                self.router.send_multipart([peer, *to_wire(encode(out))])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.router.close(linger=0)
        self.ctx.term()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Record], list[Record]]], Client]]:
    made: list[tuple[FakeBroker, Client]] = []

    def start(answer: Callable[[Record], list[Record]]) -> Client:
        broker = FakeBroker(answer)
        client = Client(f"tcp://127.0.0.1:{broker.port}", timeout=10.0)
        made.append((broker, client))
        return client

    yield start
    for broker, client in made:
        client.close()
        broker.close()


def _poll(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_progress_reports_neither_grow_the_board_nor_reach_the_terminal_raw(
    serve: Callable[[Callable[[Record], list[Record]]], Client],
) -> None:
    flood = 3 * MAX_BOARD_RANKS

    def answer(msg: Record) -> list[Record]:
        if not isinstance(msg, Exec):
            return []
        long = _ESC + "A" * (1 << 20)  # 1 MiB for one terminal line
        out: list[Record] = [Progress(msg.session, msg.job, 0, 0, 2, "first")]
        out.append(Progress(msg.session, msg.job, 1, 1, 2, long))
        out += [Progress(msg.session, msg.job, rank, 1, 2, _ESC) for rank in range(2, flood)]
        # rank 0 again, said last: a rank the board holds is updated, however full it is
        return [*out, Progress(msg.session, msg.job, 0, 1, 2, "last")]

    client = serve(answer)
    future = client.submit_async("s", Graph(1, (), (), ()), {})
    job = next(iter(client.progress._started))

    def seen_last() -> bool:
        p = client.progress.get(job)
        return p is not None and p.ranks.get(0, (0, 0, ""))[2] == "last"

    _poll(seen_last, "the last report never arrived")
    p = client.progress.get(job)
    assert p is not None
    assert len(p.ranks) <= MAX_BOARD_RANKS
    for _done, _total, op in p.ranks.values():
        assert "\x1b" not in op and "\x07" not in op and "\u202e" not in op
        assert len(op) <= 8 * MAX_LINE_CHARS
    running = client.progress.running()[job]
    assert len(running["ranks"]) <= MAX_BOARD_RANKS
    future.cancel()


def test_status_and_error_text_from_the_broker_is_printed_escaped(
    serve: Callable[[Callable[[Record], list[Record]]], Client],
) -> None:
    def answer(msg: Record) -> list[Record]:
        if isinstance(msg, StatusRequest):
            row = {"rank": 0, "state": "up", "host": f"h{_ESC}", "heartbeat_age_s": 0.1}
            session = {"session": f"s{_ESC}", "name": f"n{_ESC}"}
            status = {
                "broker_id": f"b{_ESC}",
                "ranks": [row],
                "sessions": [session],
                "errors": [f"rank 0 said {_ESC}"],
            }
            return [Reply(msg.req, status)]
        req = getattr(msg, "req", None)
        if req is None:
            return []
        error = ErrorInfo(
            "RemoteError",
            f"boom{_ESC}",
            0,
            f"op{_ESC}",
            f"Type{_ESC}",
            f"Traceback\n  line {_ESC}\n" + "x" * (1 << 20),
        )
        return [Reply(req, None, error)]

    client = serve(answer)
    table = format_status(client.status())
    assert "\x1b" not in table and "\x07" not in table and "\u202e" not in table
    assert "h\\x1b]0;pwned" in table  # shown, escaped

    with pytest.raises(RemoteError) as caught:
        client.fetch("s", 0, "obj:1")
    said = str(caught.value)
    assert "\x1b" not in said and "\x07" not in said and "\u202e" not in said
    assert "boom\\x1b" in said and "\nTraceback\n  line \\x1b" in said  # lines kept
    assert len(said) < (1 << 20)


def test_the_brokers_listing_tables_print_text_escaped() -> None:
    """``mpl-broker status --symbols`` prints a persisted name's ``meta`` and ``device`` as a
    worker's hello gave them (a party's word about its own disk): escaped, on one line."""
    from mpl.broker.listing import format_rows

    row = {"name": "model", "rank": 1, "device": f"P1{_ESC}", "meta": f"float64[3]{_ESC}\n"}
    table = format_rows([row], ("name", "rank", "device", "meta"), "none")
    assert "\x1b" not in table and "\x07" not in table and "\u202e" not in table
    assert len(table.splitlines()) == 2  # the header and one row


def test_a_values_description_from_the_wire_is_shown_escaped() -> None:
    """A job's answer describes each output (``metas``: ``float64[3]``), in the clear: the
    worker's word, relayed by the broker. ``repr(v)`` shows it escaped, on one line."""
    from mpl.driver.values import Value

    shown = repr(Value("P0", (0,), meta=f"float64[3]{_ESC}\n" + "x" * 100_000))
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\n" not in shown and len(shown) < 4 * MAX_LINE_CHARS
