"""The daemons' metrics port: a small HTTP server on its own thread.

It serves ``/metrics`` (Prometheus text format, from a prometheus_client registry), ``/``
(an HTML page) and ``/status.json``. It never touches a daemon's live tables: the pages
it is given ask the daemon's I/O loop for a copy (``mpl.wire.snapshot.SnapshotSlot``),
built on the loop's next tick, so a scrape costs the loop one status build and never
blocks it.

Nobody's clients authenticate, so what one client may hold is bounded: at most 32
connections have a thread; each read waits at most 10 s and a connection lives 30 s in
all, however it trickles, and is read at most 16 KiB (its request line and headers:
past them a 431, and nothing more read). With every slot taken, a new connection takes
the slot of the oldest one that has not yet sent its whole request, which is ended: a
scraper sends its request within a round trip of connecting, a client holding connections
idle (or trickling bytes) never does, so it cannot keep the port from everyone else (only
a flood, 32 new connections within a scraper's round trip, still ends the scraper's). A
connection whose request arrived is never ended for another.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["MetricsServer"]

log = logging.getLogger("mpl.metrics")
_MAX_CONCURRENT = 8  # requests served at once; more get 503 (scrapers and a few browsers)
# connections holding a thread at once (a request served, or one awaited for up to the
# client timeout); one past them takes the slot of the oldest still sending its request,
# or is closed unread: nobody's connections authenticate, so a client that sends nothing
# must not make a thread per connection, nor keep the slots from everyone else
_MAX_CONNECTIONS = 32
_CLIENT_TIMEOUT_S = 10.0
# what one connection may take in all: the client timeout bounds each read, and a client
# trickling a byte of its request line every few seconds would never meet it, holding its
# thread (and with 31 others, the whole port) for as long as it likes
_CONNECTION_S = 30.0
# how long accepting waits for an evicted connection's thread to end (it ends at once: its
# read returns) before giving up on the new connection, so threads stay within the bound
_EVICTED_S = 2.0
# what one connection's request (its line and headers; a GET has no body) may take: a
# scraper's or a browser's is a few hundred bytes to a few KiB; http.server's own limits
# (a 64 KiB line, 100 header lines) let a client have some 6.5 MB read into memory and
# parsed per connection, 200 MB over the slots
_MAX_REQUEST_BYTES = 16 * 1024


class MetricsServer:
    """Serves a registry on ``/metrics`` and ``page()`` on ``/`` at ``host:port``.

    Port 0 picks a free port; :attr:`port` is the one bound. ``status`` returns the JSON
    served at ``/status.json`` (None: the daemon did not answer in time, 503). A connection
    is closed after ``connection_s`` in all, whatever it sends meanwhile, and sooner if all
    slots are taken, it is the oldest that has not sent its whole request, and another
    connection arrives (see the module).
    """

    def __init__(
        self,
        registry: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        page: Callable[[], str | None] | None = None,
        status: Callable[[], dict[str, Any] | None] | None = None,
        name: str = "mpl-metrics",
        connection_s: float = _CONNECTION_S,
    ) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        busy = threading.BoundedSemaphore(_MAX_CONCURRENT)
        connections = self._connections = _Connections(
            _MAX_CONNECTIONS, connection_s, f"{name}-deadlines"
        )

        class Handler(BaseHTTPRequestHandler):
            timeout = _CLIENT_TIMEOUT_S  # a client that stalls cannot hold a thread forever

            def setup(self) -> None:
                super().setup()
                self.rfile = _Capped(self.rfile, _MAX_REQUEST_BYTES)  # type: ignore[assignment]

            def do_GET(self) -> None:
                if not connections.answering(self.request):  # evicted as its request came
                    self.close_connection = True
                    return
                if not busy.acquire(blocking=False):
                    self._reply(503, "text/plain", b"busy\n")
                    return
                try:
                    self._serve()
                finally:
                    busy.release()

            def _serve(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        self._reply(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                    elif path == "/" and page is not None:
                        html = page()
                        if html is None:
                            self._reply(503, "text/plain", b"the daemon did not answer in time\n")
                        else:
                            self._reply(200, "text/html; charset=utf-8", html.encode())
                    elif path == "/status.json" and status is not None:
                        value = status()
                        code = 200 if value is not None else 503
                        body = json.dumps(value, default=str).encode()
                        self._reply(code, "application/json", body)
                    else:
                        self._reply(404, "text/plain", b"not found: try /metrics\n")
                except BrokenPipeError:
                    pass

            def _reply(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = _MAX_CONNECTIONS  # a burst waits accepted, not in SYN retries

            def process_request(self, request: Any, client_address: Any) -> None:
                if not connections.admit(request):  # every slot answering: closed unread
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)  # its thread releases
                except BaseException:
                    connections.release(request)
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    connections.release(request)

            def handle_error(self, request: Any, client_address: Any) -> None:
                # a client gone mid-reply, or one ended (evicted, or past its time) as it
                # was sent an error: a line in the debug log, not a traceback on stderr
                log.debug("connection from %s ended: %r", client_address, sys.exc_info()[1])

        self._httpd = Server((host, port), Handler)
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True
        )
        self._thread.start()
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{self.port}/"

    def close(self) -> None:
        self._connections.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(2)


class _Connections:
    """The port's open connections: at most ``limit`` of them (each has a thread), each
    ended past its own deadline by one thread for them all (a timer per connection would
    double the threads), and with every slot taken, the oldest still sending its request
    ended to give its slot to a new one."""

    def __init__(self, limit: int, seconds: float, name: str) -> None:
        self._slots = threading.BoundedSemaphore(limit)
        self._seconds = seconds
        self._lock = threading.Lock()
        self._open: dict[Any, float] = {}  # each one's deadline, oldest first
        self._answering: set[Any] = set()  # of them, those whose request arrived
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def admit(self, request: Any) -> bool:
        """Take a slot for a new connection (on the accepting thread): a free one, or the
        one of the oldest connection not yet answering, which is ended. False: every slot
        is answering a request, and the new connection is to be closed unread."""
        if not self._slots.acquire(blocking=False):
            with self._lock:
                oldest = next((r for r in self._open if r not in self._answering), None)
                if oldest is None:
                    return False
                del self._open[oldest]  # under the lock: it can no longer start answering
            _cut_off(oldest)
            log.debug("every connection taken: ended the oldest not yet answering")
            if not self._slots.acquire(timeout=_EVICTED_S):  # its thread's, once it ends
                return False
        with self._lock:
            self._open[request] = time.monotonic() + self._seconds
        return True

    def answering(self, request: Any) -> bool:
        """Mark a connection whose request arrived as answering: never evicted from now on.
        False: it was evicted just before, and gets no answer."""
        with self._lock:
            if request not in self._open:
                return False
            self._answering.add(request)
            return True

    def release(self, request: Any) -> None:
        """Give a connection's slot back, once its thread is done with it."""
        with self._lock:
            self._open.pop(request, None)
            self._answering.discard(request)
        self._slots.release()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self._seconds / 4)):
            now = time.monotonic()
            with self._lock:
                late = [request for request, at in self._open.items() if at <= now]
            for request in late:
                _cut_off(request)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)


class _Capped:
    """A connection's reader that reads at most ``limit`` bytes in all: past them, a read
    raises ``LineTooLong``, which http.server answers with 431 while reading headers, and
    ends the connection unanswered while reading the request line."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def readline(self, size: int = -1) -> bytes:
        if self._left <= 0:
            raise http.client.LineTooLong(f"a request of more than {_MAX_REQUEST_BYTES} bytes")
        size = self._left if size < 0 else min(size, self._left)
        line: bytes = self._raw.readline(size)
        self._left -= len(line)
        if self._left <= 0 and not line.endswith(b"\n"):
            raise http.client.LineTooLong(f"a request of more than {_MAX_REQUEST_BYTES} bytes")
        return line

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data: bytes = self._raw.read(size)
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._raw.close()


def _cut_off(request: socket.socket) -> None:
    """End a connection that outlived its time: its handler's next read or write ends."""
    with contextlib.suppress(OSError):  # (already closed)
        request.shutdown(socket.SHUT_RDWR)
