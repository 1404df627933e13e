"""The ZAP handler each secure process runs: which keys may connect, and who they are.

Kept apart from ``curve.py`` because it starts a thread (pyzmq's asyncio-based
``ThreadAuthenticator``, and asyncio with it): only a secure daemon imports it, as it
starts (a plain start loads none of it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from mpl.wire.lru import LRU

__all__ = ["Gatekeeper"]

log = logging.getLogger("mpl.auth")
_REFUSAL_LOG_EVERY_S = 10.0  # one log line per refused key per this many seconds
_REFUSALS_REMEMBERED = 256
# and at most this many lines a second in all: an outsider can draw a new key for every
# handshake, and the server's public key is in every party's spec (red team w33, R33-2)
_REFUSAL_LINES_PER_S = 10


class Gatekeeper(ThreadAuthenticator):
    """A process's ZAP handler: admits the keys pinned for each domain, names their owners.

    Start it before any CURVE server socket binds (a server without a running handler
    would accept any client that knows its key), and :meth:`stop` it before the context
    terminates. A refused key is counted and logged, at most once per key every 10 s, so
    a client retrying its handshake cannot flood the log, and at most
    ``_REFUSAL_LINES_PER_S`` lines a second in all, so neither can one drawing a new key
    for every attempt (the next line written says how many were left out).
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        admits: Mapping[str, Mapping[str, str]],
        *,
        clock: Any = time.monotonic,
    ) -> None:
        super().__init__(context, log=logging.getLogger("mpl.auth.zap"))
        self._admits = {
            d: {k.encode("ascii"): who for k, who in m.items()} for d, m in admits.items()
        }
        self._names = {k: who for m in self._admits.values() for k, who in m.items()}
        self._lock = threading.Lock()
        self._logged: LRU[bytes, float] = LRU(_REFUSALS_REMEMBERED)
        self._clock = clock
        self._second = float("-inf")  # when the current second of lines began
        self._lines = 0  # lines written in it
        self.unlogged = 0  # refusals past the lines' bound, not yet said in a line
        self.refused = 0

    def start(self) -> None:
        super().start()
        for domain in self._admits:
            self.configure_curve_callback(domain, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP's question: may the client with z85 ``key`` connect to ``domain``?"""
        if key in self._admits.get(domain, {}):
            return True
        with self._lock:
            self.refused += 1
            now = self._clock()
            last = self._logged.get(key)
            if last is not None and now - last <= _REFUSAL_LOG_EVERY_S:
                return False
            if now - self._second >= 1.0:
                self._second, self._lines = now, 0
            if self._lines >= _REFUSAL_LINES_PER_S:
                self.unlogged += 1
                return False
            self._lines += 1
            self._logged[key] = now
            unlogged, self.unlogged = self.unlogged, 0
            log.warning(
                "refused a connection to %s: key %s is not in this cluster spec (%d refusals%s)",
                domain,
                key.decode("ascii", "replace"),
                self.refused,
                f", {unlogged} refusals not logged since the last line" if unlogged else "",
            )
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The identity ZeroMQ stamps on the connection's frames (``User-Id``)."""
        return self._names.get(z85.encode(client_public_key), "")
