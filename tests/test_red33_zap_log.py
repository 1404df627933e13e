"""Red team w33 (R33-2): an outsider rotating CURVE keys cannot grow a daemon's log.

Anyone who can reach a secure broker's (or worker's) port knows the server's public key
(it is in every party's spec) and can run the CurveZMQ handshake with a key of its own
making. Each attempt reaches the process's ZAP handler, which refuses the key and logs it.
Before: one WARNING line per refused *key* every 10 s, so a client drawing a fresh key per
attempt wrote one line per handshake (about 150 bytes each, as fast as it can connect),
without bound: the daemon's log, and the disk under it, grew with an outsider's traffic.
Now the refusals are counted all the same, but at most ``_REFUSAL_LINES_PER_S`` lines a
second are written, the next line saying how many were left out.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pytest
import zmq
from helpers import wait_until

from mpl.wire.curve import BROKER_DOMAIN
from mpl.wire.zap import _REFUSAL_LINES_PER_S, Gatekeeper

ATTEMPTS = 120


def _past(gate: Gatekeeper, n: int) -> bool:
    return gate.refused > n


def _handshake(ctx: zmq.Context[Any], address: str, server_public: bytes) -> zmq.Socket[Any]:
    """A raw DEALER with a key nobody pinned, dialling the CURVE server at ``address``."""
    public, secret = zmq.curve_keypair()
    sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.connect(address)
    return sock


def test_an_outsider_drawing_a_key_per_attempt_writes_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    gate = Gatekeeper(ctx, {BROKER_DOMAIN: {}})  # admits no one: every key is an outsider's
    server_public, server_secret = zmq.curve_keypair()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    gate.start()
    try:
        router.setsockopt(zmq.CURVE_SERVER, 1)
        router.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
        router.setsockopt(zmq.ZAP_DOMAIN, BROKER_DOMAIN.encode())
        router.bind("tcp://127.0.0.1:*")
        address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        with caplog.at_level(logging.WARNING, logger="mpl.auth"):
            for n in range(ATTEMPTS):  # one at a time: a client closed early asks nothing
                sock = _handshake(ctx, address, server_public)
                try:
                    wait_until(partial(_past, gate, n), 30, "the handshake to be refused")
                finally:
                    sock.close()
        lines = [r for r in caplog.records if "refused a connection" in r.getMessage()]
        # the attempts take well under the seconds it would take to earn more lines; a very
        # slow machine may spread them over a few seconds, each allowed its burst
        assert gate.refused >= ATTEMPTS
        assert len(lines) <= 4 * _REFUSAL_LINES_PER_S, len(lines)
    finally:
        router.close()
        gate.stop()
        ctx.term()


def test_the_next_line_after_a_burst_says_how_many_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Counted refusals past the burst are not lost from the record: the first line of the
    next second names how many lines were left out."""
    now = [100.0]
    ctx: zmq.Context[Any] = zmq.Context()
    gate = Gatekeeper(ctx, {BROKER_DOMAIN: {}}, clock=lambda: now[0])  # not started
    try:
        with caplog.at_level(logging.WARNING, logger="mpl.auth"):
            for _ in range(3 * _REFUSAL_LINES_PER_S):
                assert not gate.callback(BROKER_DOMAIN, zmq.curve_keypair()[0])
            now[0] += 1.5
            assert not gate.callback(BROKER_DOMAIN, zmq.curve_keypair()[0])
        lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
        assert len(lines) == _REFUSAL_LINES_PER_S + 1
        assert f"{2 * _REFUSAL_LINES_PER_S} refusals not logged" in lines[-1]
        assert gate.refused == 3 * _REFUSAL_LINES_PER_S + 1
    finally:
        ctx.term()
