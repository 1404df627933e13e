"""The metrics port, bounded in bytes per connection too (w32's closing note, left over).

The port was bounded in connections (32, each with a thread) and in time (10 s a read,
30 s in all), but not in what one connection may send: the request line up to 64 KiB, and
up to 100 header lines of 64 KiB each, read whole into memory and parsed (``http.server``'s
own limits), about 6.5 MB per connection and 200 MB over the 32 slots, from anyone
reaching the port. A scraper's or a browser's request is a few hundred bytes. Now a
connection is read at most ``_MAX_REQUEST_BYTES`` (request line and headers): past that, a
431 answer, or the connection closed, and nothing more read.

A raw TCP socket against a real ``MetricsServer``.
"""

from __future__ import annotations

import socket
import urllib.request

from mpl.wire import httpd


def _ask(server: httpd.MetricsServer, request: bytes) -> bytes:
    """Send ``request`` on a raw connection; what the server answered (b"" when it closed
    the connection or reset it first)."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        try:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # closed under our feet: it read no more
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
        return answer


def test_a_request_with_megabytes_of_headers_is_not_read_whole() -> None:
    from prometheus_client import CollectorRegistry

    server = httpd.MetricsServer(CollectorRegistry())
    try:
        pad = b"X-Pad: " + b"a" * 60_000 + b"\r\n"
        answer = _ask(server, b"GET /metrics HTTP/1.0\r\n" + pad * 90 + b"\r\n")  # 5.4 MB
        assert not answer.startswith(b"HTTP/1.0 200"), "5.4 MB of headers read and served"
        assert answer == b"" or answer.startswith(b"HTTP/1.0 431")
        long_line = b"GET /" + b"m" * 60_000 + b" HTTP/1.0\r\n\r\n"  # within http.server's 64 KiB
        assert not _ask(server, long_line).startswith(b"HTTP/1.0 404")
        # a scraper's request, and a browser's with a few KiB of headers, are served
        with urllib.request.urlopen(f"{server.url}metrics", timeout=10) as reply:
            assert reply.status == 200
        browser = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 200) for i in range(20))
        assert _ask(server, b"GET /metrics HTTP/1.0\r\n" + browser + b"\r\n").startswith(
            b"HTTP/1.0 200"
        )
    finally:
        server.close()
