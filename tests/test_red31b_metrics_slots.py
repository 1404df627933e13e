"""Second red team w31, finding B4: R6 bounded how long one connection to the metrics port
lives (10 s per read, 30 s in all), not how many slots an outsider may hold: the port
served 32 connections at once and closed the 33rd unread, so anyone reaching it (nobody's
clients authenticate) held all 32 with idle connections and opened each again as the
server ended it (every 10 s, a connect each): every scrape, the status page and
``/status.json`` stayed refused for as long as it went on.

Fixed in ``mpl.wire.httpd``: with every slot taken, a new connection takes the slot of the
oldest one that has not yet sent its whole request (line and headers), which is ended: a
scraper's request arrives within a round trip, an idle or trickling holder's never. A
connection whose request arrived is never ended for another; the 32-thread bound, the
per-read timeout and the 30 s in all stay.
"""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from helpers import wait_until

from mpl.wire import httpd


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ended ``sock`` (it sends idle clients nothing before that)."""
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset: ended too
        return True


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def scrape(server: httpd.MetricsServer) -> int:
    try:
        with urllib.request.urlopen(f"{server.url}metrics", timeout=5) as reply:
            return int(reply.status)
    except (urllib.error.URLError, ConnectionError) as exc:
        raise AssertionError(f"the scrape was refused: {exc}") from None


def test_a_scrape_gets_through_while_32_connections_sit_idle() -> None:
    from prometheus_client import CollectorRegistry

    server = httpd.MetricsServer(CollectorRegistry())
    idle: list[socket.socket] = []
    try:
        for _ in range(32):
            idle.append(socket.create_connection((server.host, server.port)))
        # the server accepts in order, so the 32 idle connections take their slots first
        with urllib.request.urlopen(f"{server.url}metrics", timeout=5) as reply:
            assert reply.status == 200
    except (urllib.error.URLError, ConnectionError) as exc:
        raise AssertionError(f"the scrape was refused: {exc}") from None
    finally:
        for sock in idle:
            sock.close()
        server.close()


def test_connections_trickling_their_request_give_their_slots_up_oldest_first(
    opened: list[socket.socket],
) -> None:
    """The slowloris of R6, 32 times over: each connection has sent part of its request
    line, or the line and part of its headers, and sends a byte now and then."""
    from prometheus_client import CollectorRegistry

    server = httpd.MetricsServer(CollectorRegistry())
    try:
        partial = (b"GET /metrics HT", b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        for i in range(32):
            opened.append(socket.create_connection((server.host, server.port)))
            opened[-1].sendall(partial[i % 2])
        for sock in opened:
            sock.sendall(b"b")  # still trickling: the read timeout never ends them
        assert scrape(server) == 200
        wait_until(lambda: closed_by_server(opened[0]), 10, "the oldest to end")
        # three more arrive, idle: each takes the slot of the oldest trickling one (the
        # scrape's slot, once free, saves one of them)
        newer = [socket.create_connection((server.host, server.port)) for _ in range(3)]
        wait_until(lambda: closed_by_server(opened[2]), 10, "the next oldest to end")
        gone = [i for i, sock in enumerate(opened) if closed_by_server(sock)]
        assert gone in ([0, 1, 2], [0, 1, 2, 3])
        opened.extend(newer)
        assert not any(closed_by_server(sock) for sock in newer)
    finally:
        server.close()


def test_a_connection_being_answered_is_never_evicted(opened: list[socket.socket]) -> None:
    """Eight requests are being answered (the page stalls), the other 24 slots are idle,
    and 40 more connections arrive: each ends the oldest idle one, none an answered one."""
    from prometheus_client import CollectorRegistry

    release = threading.Event()
    entered = threading.Semaphore(0)

    def page() -> str:
        entered.release()
        release.wait(30)
        return "<p>the page</p>"

    server = httpd.MetricsServer(CollectorRegistry(), page=page)
    try:
        answered = [socket.create_connection((server.host, server.port)) for _ in range(8)]
        opened.extend(answered)
        for sock in answered:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        for _ in range(8):
            assert entered.acquire(timeout=10), "a request never reached the page"
        idle = [socket.create_connection((server.host, server.port)) for _ in range(24)]
        opened.extend(idle)
        later = [socket.create_connection((server.host, server.port)) for _ in range(40)]
        opened.extend(later)
        # 40 arrivals end the 24 first idle ones, then the 16 oldest of their own
        gone = idle + later[:16]
        wait_until(lambda: all(closed_by_server(s) for s in gone), 10, "the oldest idle to end")
        assert not any(closed_by_server(sock) for sock in later[16:])
        release.set()
        for sock in answered:
            sock.settimeout(10)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
            assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"<p>the page</p>")
    finally:
        release.set()
        server.close()


def test_a_connection_that_stops_sending_is_ended_by_the_read_timeout(
    opened: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read waits at most the client timeout (10 s; shortened here), well before the
    connection's time in all (set far off here, so it is not what ends them)."""
    from prometheus_client import CollectorRegistry

    monkeypatch.setattr(httpd, "_CLIENT_TIMEOUT_S", 0.5)
    server = httpd.MetricsServer(CollectorRegistry(), connection_s=600)
    try:
        for sent in (b"", b"GET /metrics HT", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"):
            opened.append(socket.create_connection((server.host, server.port)))
            opened[-1].sendall(sent)
        wait_until(lambda: all(closed_by_server(s) for s in opened), 10, "the read timeout")
    finally:
        server.close()
