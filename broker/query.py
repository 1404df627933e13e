"""One-shot questions to a running broker, for the command line and launchers."""

from __future__ import annotations

import itertools
import time
from typing import Any

import zmq

from mpl.wire.curve import Curve
from mpl.wire.errors import MplTimeoutError, ProtocolError
from mpl.wire.sessions import ListRequest, Reply, StatusRequest
from mpl.wire.sockets import CONTROL_MAX_MESSAGE, configure, recv_message, send_message

__all__ = ["StatusProbe", "query_status"]


class StatusProbe:
    """Asks a broker for its status over one socket, as often as needed.

    A question sent before the broker listens waits in the socket and is answered the
    moment it comes up, which is what a launcher waiting for readiness wants.
    """

    def __init__(self, url: str, *, curve: Curve | None = None) -> None:
        self.url = url
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = configure(
            self._ctx.socket(zmq.DEALER), linger_ms=0, max_message=CONTROL_MAX_MESSAGE
        )
        if curve is not None:
            curve.dial(self._sock, curve.broker)
        self._sock.connect(url)
        self._reqs = itertools.count(1)

    def ask(self, timeout: float, what: str = "status") -> dict[str, Any]:
        """The broker's status, or (``what`` = ``symbols``) its listing of persisted names."""
        req = next(self._reqs)
        send_message(self._sock, StatusRequest(req) if what == "status" else ListRequest(req, what))
        deadline = time.monotonic() + timeout
        while self._sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            msg = recv_message(self._sock)
            if isinstance(msg, Reply) and msg.req == req:
                if msg.error is not None:
                    msg.error.raise_()
                if not isinstance(msg.value, dict):
                    raise ProtocolError(f"{what} reply is not a mapping")
                return msg.value
        raise MplTimeoutError(f"no answer from a broker at {self.url} within {timeout:g} s")

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()

    def __enter__(self) -> StatusProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def query_status(
    url: str, *, timeout: float = 5.0, curve: Curve | None = None, what: str = "status"
) -> dict[str, Any]:
    """Ask the broker at ``url`` for its status dict (or the ``symbols`` listing);
    MplTimeoutError if it does not answer."""
    with StatusProbe(url, curve=curve) as probe:
        return probe.ask(timeout, what)
