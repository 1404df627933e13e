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


class Gatekeeper(ThreadAuthenticator):
    """A process's ZAP handler: admits the keys pinned for each domain, names their owners.

    Start it before any CURVE server socket binds (a server without a running handler
    would accept any client that knows its key), and :meth:`stop` it before the context
    terminates. A refused key is counted and logged, at most once per key every 10 s, so
    a client retrying its handshake cannot flood the log.
    """

    def __init__(self, context: zmq.Context[Any], admits: Mapping[str, Mapping[str, str]]) -> None:
        super().__init__(context, log=logging.getLogger("mpl.auth.zap"))
        self._admits = {
            d: {k.encode("ascii"): who for k, who in m.items()} for d, m in admits.items()
        }
        self._names = {k: who for m in self._admits.values() for k, who in m.items()}
        self._lock = threading.Lock()
        self._logged: LRU[bytes, float] = LRU(_REFUSALS_REMEMBERED)
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
            now = time.monotonic()
            last = self._logged.get(key)
            if last is None or now - last > _REFUSAL_LOG_EVERY_S:
                self._logged[key] = now
                log.warning(
                    "refused a connection to %s: key %s is not in this cluster spec (%d refusals)",
                    domain,
                    key.decode("ascii", "replace"),
                    self.refused,
                )
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The identity ZeroMQ stamps on the connection's frames (``User-Id``)."""
        return self._names.get(z85.encode(client_public_key), "")
