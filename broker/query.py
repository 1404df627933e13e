"""One-shot questions to a running broker, for the command line."""

from __future__ import annotations

import time
from typing import Any

import zmq

from mpl.wire.errors import MplTimeoutError, ProtocolError
from mpl.wire.sessions import Reply, StatusRequest
from mpl.wire.sockets import configure, recv_message, send_message

__all__ = ["query_status"]


def query_status(url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the broker at ``url`` for its status dict; MplTimeoutError if it does not answer."""
    ctx = zmq.Context()
    sock = configure(ctx.socket(zmq.DEALER), linger_ms=0)
    try:
        sock.connect(url)
        send_message(sock, StatusRequest(1))
        deadline = time.monotonic() + timeout
        while sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            msg = recv_message(sock)
            if isinstance(msg, Reply) and msg.req == 1:
                if msg.error is not None:
                    msg.error.raise_()
                if not isinstance(msg.value, dict):
                    raise ProtocolError("status reply is not a mapping")
                return msg.value
        raise MplTimeoutError(f"no answer from a broker at {url} within {timeout:g} s")
    finally:
        sock.close()
        ctx.term()
