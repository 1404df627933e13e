"""Red team w33 (R33-2): an outsider rotating CURVE keys cannot grow a daemon's log.

Anyone who can reach a secure broker's (or worker's) port knows the server's public key
(it is in every party's spec) and can run the CurveZMQ handshake with a key of its own
making. Each attempt reaches the process's ZAP handler, which refuses the key and logs it.
Before: one WARNING line per refused *key* every 10 s, so a client drawing a fresh key per
attempt wrote one line per handshake (about 150 bytes each, as fast as it can connect),
without bound: the daemon's log, and the disk under it, grew with an outsider's traffic.
Then (R33-2's fix) at most ``_REFUSAL_LINES_PER_S`` lines a second, which under a sustained
flood still wrote ~860,000 lines a day (review w33, V33-7). Now the refusals are counted all
the same, but a burst of at most ``_REFUSAL_BURST`` lines is written, then one summary line
("N refusals not logged") per ``_REFUSAL_SUMMARY_EVERY_S`` while the flood lasts.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pytest
import zmq
from helpers import wait_until

from mpl.wire.curve import BROKER_DOMAIN
from mpl.wire.zap import _REFUSAL_BURST, _REFUSAL_SUMMARY_EVERY_S, Gatekeeper

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
        # one burst, then (past it) nothing until the interval ends: however slow the
        # machine, the attempts cannot earn more than a burst and a few summaries
        assert gate.refused >= ATTEMPTS
        assert len(lines) <= _REFUSAL_BURST, len(lines)
    finally:
        router.close()
        gate.stop()
        ctx.term()


def _fresh_key() -> bytes:
    return zmq.curve_keypair()[0]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]


def test_the_next_line_after_a_burst_says_how_many_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Counted refusals past the burst are not lost from the record: the first refusal of
    the next interval writes a line naming how many were left out."""
    now = [100.0]
    ctx: zmq.Context[Any] = zmq.Context()
    gate = Gatekeeper(ctx, {BROKER_DOMAIN: {}}, clock=lambda: now[0])  # not started
    try:
        with caplog.at_level(logging.WARNING, logger="mpl.auth"):
            for _ in range(3 * _REFUSAL_BURST):
                assert not gate.callback(BROKER_DOMAIN, _fresh_key())
            now[0] += 1.5  # within the interval: no line
            assert not gate.callback(BROKER_DOMAIN, _fresh_key())
            assert len(_lines(caplog)) == _REFUSAL_BURST
            now[0] += _REFUSAL_SUMMARY_EVERY_S
            assert not gate.callback(BROKER_DOMAIN, _fresh_key())
        lines = _lines(caplog)
        assert len(lines) == _REFUSAL_BURST + 1
        assert lines[-1].startswith(f"{2 * _REFUSAL_BURST + 1} refusals not logged")
        assert gate.refused == 3 * _REFUSAL_BURST + 2
        assert gate.unlogged == 1  # the flood goes on: the last one waits for its summary
    finally:
        ctx.term()


def test_a_sustained_flood_writes_one_summary_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """V33-7: a day-long flood of new keys (here 100 an second for an hour of a fake clock)
    writes one burst, then one line per interval, and every refusal is counted in them; a
    quiet interval after it allows a burst again."""
    now = [0.0]
    ctx: zmq.Context[Any] = zmq.Context()
    gate = Gatekeeper(ctx, {BROKER_DOMAIN: {}}, clock=lambda: now[0])
    seconds, per_second = 3600, 100
    keys = [f"{n:040d}".encode() for n in range(seconds * per_second)]  # each one new
    try:
        with caplog.at_level(logging.WARNING, logger="mpl.auth"):
            for n, key in enumerate(keys):
                now[0] = n / per_second
                assert not gate.callback(BROKER_DOMAIN, key)
            lines = _lines(caplog)
            summaries = [line for line in lines if "refusals not logged" in line]
            intervals = int(seconds / _REFUSAL_SUMMARY_EVERY_S)
            assert len(lines) - len(summaries) == _REFUSAL_BURST
            assert intervals - 1 <= len(summaries) <= intervals, len(summaries)
            said = sum(int(line.split(" ", 1)[0]) for line in summaries)
            assert gate.refused == len(keys)
            assert said + gate.unlogged + _REFUSAL_BURST == len(keys)  # none lost
            # the flood stops; after a quiet interval an outsider's refusal is a line again
            now[0] += 2 * _REFUSAL_SUMMARY_EVERY_S
            before = len(_lines(caplog))
            for n in range(3):
                assert not gate.callback(BROKER_DOMAIN, f"quiet{n}".encode())
            after = _lines(caplog)[before:]
            assert len(after) == 4 and "refusals not logged" in after[0]
            assert all("is not in this cluster spec" in line for line in after[1:])
    finally:
        ctx.term()
