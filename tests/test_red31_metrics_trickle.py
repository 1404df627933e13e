"""Red team w31, finding R6: an outsider trickling bytes kept the metrics port's connections
for as long as it liked, and 32 of them closed the port to everyone else.

The metrics server (``mpl.wire.httpd``: every daemon's ``--metrics-port``, whose clients
nobody authenticates) gives each connection a thread, at most 32, and a 10 s timeout per
read. A client that sends one byte of its request line every few seconds never meets that
timeout: its connection, and its thread, stay as long as it goes on, and 32 such clients
leave every scrape and the status page refused. Now a connection is closed after a time
in all (``connection_s``, 30 s by default), whatever it sends meanwhile.
"""

from __future__ import annotations

import socket
import time

from mpl.wire import httpd


def test_a_trickling_client_is_cut_off_after_its_time_in_all() -> None:
    from prometheus_client import CollectorRegistry

    server = httpd.MetricsServer(CollectorRegistry(), connection_s=1.0)
    sock = socket.create_connection((server.host, server.port))
    sock.settimeout(0.05)
    try:
        sent, closed = 0, False
        deadline = time.monotonic() + 8  # eight times the bound; each read waits 0.05 s
        request = b"GET /metrics HTTP/1.1\r\n" + b"X" * 1000
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(request[sent : sent + 1])  # the attack: a byte at a time
                sent += 1
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:  # reset or broken pipe: closed by the server
                closed = True
        assert closed, f"the server still reads a request trickled over 8 s ({sent} bytes)"
    finally:
        sock.close()
        server.close()
