"""Second red team w31, finding B4 (open, strict xfail): R6 bounded how long one
connection to the metrics port lives (10 s per read, 30 s in all), not how many slots an
outsider may hold: the port serves 32 connections at once and closes the 33rd unread, so
anyone reaching it (nobody's clients authenticate) holds all 32 with idle connections and
opens each again as the server ends it (every 10 s, a connect each): every scrape, the
status page and ``/status.json`` stay refused for as long as it goes on.

The fix, in ``mpl.wire.httpd`` (left for its owner: it changes how the server accepts): with
every slot taken, end the oldest connection that has not yet sent its request line and
give its slot to the new one (a scraper's request arrives within a round trip, an idle
holder's never), or give a request line a few seconds in all, not the connection 30.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from mpl.wire import httpd


@pytest.mark.xfail(
    strict=True,
    reason="B4: 32 idle connections hold every slot of the metrics port (see the module)",
)
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
