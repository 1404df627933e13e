"""The daemons' metrics port: a small HTTP server on its own thread.

It serves ``/metrics`` (Prometheus text format, from a prometheus_client registry), ``/``
(an HTML page) and ``/status.json``. It never touches a daemon's live tables: the pages
it is given ask the daemon's I/O loop for a copy (``mpl.wire.snapshot.SnapshotSlot``),
built on the loop's next tick, so a scrape costs the loop one status build and never
blocks it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["MetricsServer"]

log = logging.getLogger("mpl.metrics")
_MAX_CONCURRENT = 8  # requests served at once; more get 503 (scrapers and a few browsers)
# connections holding a thread at once (a request served, or one awaited for up to the
# client timeout); one past them is closed unread: nobody's connections authenticate, so
# a client that sends nothing must not make a thread per connection
_MAX_CONNECTIONS = 32
_CLIENT_TIMEOUT_S = 10.0
# what one connection may take in all: the client timeout bounds each read, and a client
# trickling a byte of its request line every few seconds would never meet it, holding its
# thread (and with 31 others, the whole port) for as long as it likes
_CONNECTION_S = 30.0


class MetricsServer:
    """Serves a registry on ``/metrics`` and ``page()`` on ``/`` at ``host:port``.

    Port 0 picks a free port; :attr:`port` is the one bound. ``status`` returns the JSON
    served at ``/status.json`` (None: the daemon did not answer in time, 503). A connection
    is closed after ``connection_s`` in all, whatever it sends meanwhile.
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
        deadlines = self._deadlines = _Deadlines(connection_s, f"{name}-deadlines")
        connected = threading.BoundedSemaphore(_MAX_CONNECTIONS)

        class Handler(BaseHTTPRequestHandler):
            timeout = _CLIENT_TIMEOUT_S  # a client that stalls cannot hold a thread forever

            def do_GET(self) -> None:
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
                if not connected.acquire(blocking=False):  # bounded: closed at once
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)  # its thread releases
                except BaseException:
                    connected.release()
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                deadlines.add(request)  # cut off at connection_s, however it trickles
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    deadlines.remove(request)
                    connected.release()

        self._httpd = Server((host, port), Handler)
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True
        )
        self._thread.start()
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{self.port}/"

    def close(self) -> None:
        self._deadlines.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(2)


class _Deadlines:
    """The open connections' deadlines, and one thread that ends each connection past its
    own (a thread for them all: a timer per connection would double the threads)."""

    def __init__(self, seconds: float, name: str) -> None:
        self._seconds = seconds
        self._lock = threading.Lock()
        self._open: dict[Any, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, request: Any) -> None:
        with self._lock:
            self._open[request] = time.monotonic() + self._seconds

    def remove(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)

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


def _cut_off(request: socket.socket) -> None:
    """End a connection that outlived its time: its handler's next read or write ends."""
    with contextlib.suppress(OSError):  # (already closed)
        request.shutdown(socket.SHUT_RDWR)
