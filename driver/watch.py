"""The driver's watch on its broker: heartbeats, CURVE handshakes, and broker restarts.

One background thread per client heartbeats on a socket of its own, naming the client's open
sessions to keep their leases, and listens:

* a broker silent for ``HEARTBEAT_LIVENESS`` heartbeats sets ``silence``, so waiting calls
  and futures fail at once (``MplTimeoutError``) instead of running out their deadlines;
* a ``Reregister`` from a broker with a new id means it restarted and forgot our sessions:
  they are remembered in ``lost``, so calls in flight for them fail at once
  (``SessionError``), and ``on_restart`` lets the client forget what the broker forgot;
* in secure mode the socket's handshakes are monitored: a broker that refuses this
  driver's key (or cannot answer a CURVE hello for the pinned key) sets ``refused`` for
  good (``AuthenticationError``).

The watch only reports: calls ask :meth:`BrokerWatch.trouble` while they wait.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.control import HEARTBEAT_LIVENESS, Heartbeat, Reregister
from mpl.wire.curve import Curve
from mpl.wire.errors import (
    AuthenticationError,
    MplError,
    MplTimeoutError,
    ProtocolError,
    SessionError,
)
from mpl.wire.lru import LRU
from mpl.wire.routing import driver_routing_id
from mpl.wire.sockets import CONTROL_MAX_MESSAGE, configure

__all__ = ["BrokerWatch"]

log = logging.getLogger("mpl.driver")
_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_CONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
)
# A server that does not hold the pinned key cannot answer our CURVE hello: it drops the
# connection without an error event. This many connections in a row without a handshake
# (one per reconnect interval, ~0.1 s) mean we are not talking to our broker.
_CONNECTS_WITHOUT_HANDSHAKE = 5
_LOST_MEMORY = 1024  # sessions a restarted broker forgot, remembered this many at most


class BrokerWatch:
    """Heartbeats the broker at ``address`` for ``sessions`` and reports its trouble.

    ``sessions`` is the client's own set of open sessions (read for each beat, cleared when
    the broker restarts); ``on_restart`` runs on the watch thread when the broker says it
    forgot this driver (a restart or an expiry), before ``sessions`` is cleared.
    """

    def __init__(
        self,
        ctx: zmq.Context[Any],
        address: str,
        driver: str,
        sessions: set[str],
        *,
        heartbeat_s: float,
        curve: Curve | None,
        broker_id: Callable[[], str],
        on_restart: Callable[[], None],
    ) -> None:
        self._ctx = ctx
        self._address = address
        self._driver = driver
        self._sessions = sessions
        self._heartbeat_s = heartbeat_s
        self._curve = curve
        self._broker_id = broker_id
        self._on_restart = on_restart
        self.silence: MplError | None = None  # set while the broker is not heard
        self.refused: MplError | None = None  # set for good when the broker refuses our key
        # sessions a restarted broker forgot: calls in flight for them fail at once
        self.lost: LRU[str, bool] = LRU(_LOST_MEMORY)
        self._unshaken = 0  # connections without a CURVE handshake, in a row
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mpl-driver-beat", daemon=True)
        self._thread.start()

    def trouble(self, session: str | None, what: str) -> MplError | None:
        """Why a call about ``what`` in ``session`` cannot be answered, or None."""
        if self.refused is not None:
            return self.refused
        if self.silence is not None:
            return self.silence
        if session is not None and session in self.lost:  # sent to a broker now gone
            return SessionError(
                f"{what}: the broker at {self._address} restarted and lost session "
                f"{session}; open a new session"
            )
        return None

    def close(self) -> None:
        """Stop the thread (it closes its own sockets; bounded wait)."""
        self._closing.set()
        self._thread.join(5)

    def _run(self) -> None:
        sock = configure(self._ctx.socket(zmq.DEALER), linger_ms=0, max_message=CONTROL_MAX_MESSAGE)
        monitor: zmq.Socket[Any] | None = None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if self._curve is not None:
            self._curve.dial(sock, self._curve.broker)
            monitor = sock.get_monitor_socket(_HANDSHAKE_EVENTS)
            poller.register(monitor, zmq.POLLIN)
        sock.setsockopt(zmq.ROUTING_ID, driver_routing_id(self._driver))
        sock.connect(self._address)
        heard = time.monotonic()
        next_beat = heard
        try:
            while not self._closing.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self._heartbeat_s
                    beat = to_wire(encode(Heartbeat(sessions=sorted(self._sessions))))
                    with contextlib.suppress(zmq.Again):  # a full queue: this beat is moot
                        sock.send_multipart(beat, zmq.NOBLOCK)
                ready = dict(poller.poll(int(max(0.0, next_beat - now) * 1000) + 1))
                if monitor is not None and monitor in ready:
                    self._handshake_event(monitor)
                if sock in ready:
                    heard = time.monotonic()
                    self.silence = None
                    try:
                        msg = decode(from_wire(sock.recv_multipart(copy=False)), safe=True)
                    except ProtocolError:
                        continue
                    if isinstance(msg, Reregister):
                        self._forgotten(msg)
                elif time.monotonic() - heard > self._heartbeat_s * HEARTBEAT_LIVENESS:
                    self.silence = MplTimeoutError(
                        f"no heartbeat from the broker at {self._address} for "
                        f"{time.monotonic() - heard:.1f} s: {self._silence_hint()}"
                    )
        finally:
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
            sock.close()

    def _silence_hint(self) -> str:
        """What to check when the broker does not answer (never, or no longer)."""
        if self._curve is not None:
            return "is mpl-broker running at that address?"
        return (
            "is mpl-broker running at that address? (a secure broker answers only a driver "
            "connected with key= and cluster=)"
        )

    def _forgotten(self, msg: Reregister) -> None:
        """The broker does not know this driver (it restarted, or our leases expired)."""
        self._on_restart()
        if self._sessions:
            log.warning("the broker at %s restarted; sessions lost", self._address)
            if msg.broker_id != self._broker_id():  # not an expiry: a restart
                for sid in list(self._sessions):
                    self.lost[sid] = True
            self._sessions.clear()

    def _handshake_event(self, monitor: zmq.Socket[Any]) -> None:
        frames = monitor.recv_multipart()
        event = int.from_bytes(frames[0][:2], "little")
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._unshaken = 0
            return
        if event == zmq.EVENT_CONNECTED:
            self._unshaken += 1
            if self._unshaken < _CONNECTS_WITHOUT_HANDSHAKE:
                return
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.refused = AuthenticationError(
                f"the broker at {self._address} refused this driver's key "
                f"{self._curve.keys.public if self._curve else ''}: it is not among the "
                "drivers its cluster spec lists"
            )
        else:
            self.refused = AuthenticationError(
                f"no secure handshake with the broker at {self._address}: it does not run "
                "CURVE, or its key is not the broker key this driver pinned"
            )
        log.error("%s", self.refused)
