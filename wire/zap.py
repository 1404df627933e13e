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
# and in all: a burst of at most this many lines, then, while refusals keep coming past it,
# one summary line per interval. An outsider can draw a new key for every handshake, and the
# server's public key is in every party's spec (red team w33, R33-2); a burst per second
# still let a sustained flood write ~860,000 lines a day (review w33, V33-7): now ~8,640.
_REFUSAL_BURST = 10
_REFUSAL_SUMMARY_EVERY_S = 10.0


class Gatekeeper(ThreadAuthenticator):
    """A process's ZAP handler: admits the keys pinned for each domain, names their owners.

    Start it before any CURVE server socket binds (a server without a running handler
    would accept any client that knows its key), and :meth:`stop` it before the context
    terminates. Every refused key is counted (``refused``) and logged at most once per key
    every 10 s, so a client retrying its handshake cannot flood the log; nor can one drawing
    a new key for every attempt: an interval (``_REFUSAL_SUMMARY_EVERY_S``) writes at most
    ``_REFUSAL_BURST`` lines, and once refusals go past that, the flood writes only one
    summary line per interval ("N refusals not logged") until an interval passes with none
    left out, when the burst is allowed again.
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
        self._interval = float("-inf")  # when the current interval of lines began
        self._lines = 0  # per-key lines written in it
        self._flooding = False  # the last interval left refusals out: summaries only
        self.unlogged = 0  # refusals past the burst, not yet said in a summary line
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
            if now - self._interval >= _REFUSAL_SUMMARY_EVERY_S:
                self._next_interval(now)
            if self._flooding or self._lines >= _REFUSAL_BURST:
                self._flooding = True
                self.unlogged += 1
                return False
            self._lines += 1
            self._logged[key] = now
            log.warning(
                "refused a connection to %s: key %s is not in this cluster spec (%d refusals)",
                domain,
                key.decode("ascii", "replace"),
                self.refused,
            )
        return False

    def _next_interval(self, now: float) -> None:
        """Start a new interval at ``now``, first saying how many the last one left out.

        The flood goes on (summaries only) if the interval that just ended left refusals
        out and ended no longer than an interval ago; a quiet interval between allows the
        burst again."""
        unlogged, elapsed = self.unlogged, now - self._interval
        quiet = elapsed >= 2 * _REFUSAL_SUMMARY_EVERY_S
        self._flooding = bool(unlogged) and not quiet
        self._interval, self._lines, self.unlogged = now, 0, 0
        if unlogged:
            log.warning(
                "%d refusals not logged in the last %.0f s (refused a connection: keys not "
                "in this cluster spec; %d refusals in all)",
                unlogged,
                elapsed,
                self.refused,
            )

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The identity ZeroMQ stamps on the connection's frames (``User-Id``)."""
        return self._names.get(z85.encode(client_public_key), "")
