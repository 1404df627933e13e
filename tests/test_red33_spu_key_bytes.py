"""Red team w33 (R33-7): a party's SPU message cannot hide its size in its lane id or key.

Each SPU message is ``[magic, lane id, source rank, libspu key, payload]``; the receiver
keeps it under ``(lane, source, key)`` until a run takes it: in the holding area (lanes not
open yet: 1,024 entries, 256 MiB, 10 s) or in the lane's mailbox (open lanes: each sender
its share of ``MAX_SPU_PENDING`` entries and ``MAX_SPU_PENDING_BYTES`` bytes, for the
session's life). Both counted the payload's bytes only (red team w32's R32-3 shares), and
the two names are raw frames of any length up to the message bound (4 GiB). So a co-party
(its connection proves only its rank) sent messages of one empty payload and a 1 MiB key:
every one was kept, counted as 0 bytes, up to the entries bound (50,000 per sender in an
open lane of 2 ranks: 50 GB). libspu's keys are about 20 bytes (``root:P2P-12:1->0``) and a
lane id is the session id, the device, 8 hex and a count; the receiver now refuses either
past ``MAX_SPU_NAME_BYTES`` as a malformed message, counted against the sender.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from helpers import wait_until

from mpl.worker.holding import held_spu
from mpl.worker.spu_link import MAX_SPU_NAME_BYTES, SPU_MAGIC, SpuLinks

MESSAGES = 64
BIG = 1 << 20  # a 1 MiB name, an empty payload


@pytest.fixture
def link() -> Iterator[tuple[SpuLinks, zmq.Socket[Any]]]:
    """Rank 0's real SPU link (plaintext, world of 2) and a raw PUSH dialling it."""
    ctx: zmq.Context[Any] = zmq.Context()
    links = SpuLinks(ctx, "tcp://127.0.0.1:*", 0, lambda: {}, holding=held_spu(None, lambda: 2))
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(links.address)
    try:
        yield links, push
    finally:
        push.close()
        links.close()
        ctx.term()


def _held(links: SpuLinks) -> tuple[int, int]:
    """Messages kept (held, or waiting in open lanes) and the bytes of their names."""
    mailbox = links.mailbox
    held = mailbox._held  # what waits for lanes not open, under ((lane, src, key), n)
    keys: list[Any] = [k[0] for group in held._groups.values() for k in list[Any](group.items)]
    keys += list(mailbox._items)  # open lanes' keys: (lane, src, key)
    names = sum(len(lane) + len(key) for lane, _src, key in keys)
    return held.entries + mailbox.entries, names


@pytest.mark.parametrize("name", ["lane", "key"])
@pytest.mark.parametrize("lane_open", [False, True], ids=["held", "open-lane"])
def test_a_peer_cannot_park_megabytes_in_spu_names(
    link: tuple[SpuLinks, zmq.Socket[Any]], name: str, lane_open: bool
) -> None:
    links, push = link
    lane = "s~x/SP0/00000000/0"
    if lane_open:
        links.open_lane(lane)
    for n in range(MESSAGES):
        big = (b"%d-" % n).ljust(BIG, b"k")
        frames = [SPU_MAGIC, lane.encode(), b"1", b"root:P2P-1:1->0", b""]
        frames[1 if name == "lane" else 3] = big
        push.send_multipart(frames)
    wait_until(
        lambda: links.protocol_errors + _held(links)[0] >= MESSAGES,
        30,
        "every message to be kept or refused",
    )
    kept, name_bytes = _held(links)
    assert name_bytes <= MESSAGES * 2 * MAX_SPU_NAME_BYTES, (kept, name_bytes)
    assert links.protocol_errors == MESSAGES  # each counted against its sender


def test_genuine_names_pass(link: tuple[SpuLinks, zmq.Socket[Any]]) -> None:
    links, push = link
    lane = "s" * 128 + "~" + "x" * 24 + "/" + "D" * 64 + "/00000000/12"
    links.open_lane(lane)
    push.send_multipart([SPU_MAGIC, lane.encode(), b"1", b"root-1:17:ALLGATHER", b"data"])
    wait_until(lambda: _held(links)[0] == 1, 30, "the message to be kept")
    assert links.protocol_errors == 0
