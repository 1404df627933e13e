"""Red team w33 (R33-8): a party's move cannot hide its size in its session, job or sealer.

A move for a job this worker does not know yet waits in the holding area (1,024 entries,
256 MiB, 10 s, each sender its share) under ``(session, job, op, seq, src, sealer)``. The
area counts the value's bytes, not the key's, and the three strings are the sender's to
write, each up to the header bound (16 MiB). So a co-party kept 16 MiB per held entry
counted as a few bytes: half the area's entries in a world of 2, 512 x 48 MiB, for 10 s at a
time. A genuine session id is a name of at most 128 characters and a 25-character tail, a
job id 24 hex digits, a sealer ``driver:`` and a name of at most 64: the peer thread now
refuses a move whose names are longer than ``MAX_MOVE_NAME_CHARS`` each, as that sender's
protocol error.
"""

from __future__ import annotations

from typing import Any

import pytest
import zmq
from helpers import pushed_intake, wait_until

from mpl.wire.codec import encode, to_wire
from mpl.wire.data import Move
from mpl.worker.holding import held_moves
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.peer_intake import MAX_MOVE_NAME_CHARS

MOVES = 32
BIG = 1 << 20


def _held_name_chars(holding: Any) -> int:
    return sum(
        len(key[0][0]) + len(key[0][1]) + len(key[0][5])
        for group in holding._groups.values()
        for key in group.items
    )


@pytest.mark.parametrize("field", ["session", "job", "sealer"])
def test_a_peer_cannot_park_megabytes_in_a_moves_names(
    zmq_ctx: zmq.Context[Any], field: str
) -> None:
    holding = held_moves(None, lambda: 2)
    mailbox = move_mailbox(holding)
    with pushed_intake(zmq_ctx, mailbox) as (intake, [push]):
        for n in range(MOVES):
            names = {"session": "s~x", "job": f"j{n}", "sealer": ""}
            names[field] = f"{n}-".ljust(BIG, "x")
            move = Move(names["session"], names["job"], 0, 0, 1, 0, b"", names["sealer"])
            push.send_multipart(to_wire(encode(move)))
        wait_until(
            lambda: intake.errors + holding.entries >= MOVES,
            30,
            "every move to be held or refused",
        )
        assert _held_name_chars(holding) <= MOVES * 3 * MAX_MOVE_NAME_CHARS
        assert intake.errors == MOVES


def test_genuine_names_pass(zmq_ctx: zmq.Context[Any]) -> None:
    holding = held_moves(None, lambda: 2)
    mailbox = move_mailbox(holding)
    with pushed_intake(zmq_ctx, mailbox) as (intake, [push]):
        session = "s" * 128 + "~" + "x" * 24
        move = Move(session, "0" * 24, 0, 0, 1, 0, b"v", "driver:" + "d" * 64)
        push.send_multipart(to_wire(encode(move)))
        wait_until(lambda: holding.entries == 1, 30, "the move to be held")
        assert intake.errors == 0
