"""Wire version 4: a message's magic and header are ONE frame, and only that form is read.

Every reader that faces another party gets what a peer of version 3 sends (the magic a
frame of its own), this version's magic in a frame of its own, an empty first frame, a
first frame of 1 to 4 bytes and a header over ``MAX_HEADER_BYTES``: each is refused as a
bad message (counted, a ProtocolError), and the daemon keeps serving. The broker and a
worker are real processes; the driver's reader is a ``Client`` against a fake broker.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest
import zmq
from helpers import fake_broker, pushed_intake
from test_batch import Raw, wait_protocol_errors, worker_process

from mpl.driver.client import Client
from mpl.wire import GraphBuilder
from mpl.wire.codec import (
    MAGIC_FRAME,
    MAX_HEADER_BYTES,
    VERSION,
    decode,
    encode,
    from_wire,
    to_wire,
)
from mpl.wire.control import Refused
from mpl.wire.data import Move
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Exec, output_uri
from mpl.wire.sessions import Reply, StatusRequest
from mpl.worker.keyed_mailbox import move_mailbox

_OLD = VERSION - 1


def _hostile(header: bytes) -> dict[str, list[bytes]]:
    """What a peer may send in place of a message whose codec header is ``header``."""
    return {
        "version 3": [b"MPL" + bytes([_OLD]), header],
        "version 3, sealed Exec": [b"MPS" + bytes([_OLD]), header],
        "this magic, a frame of its own": [MAGIC_FRAME, header],
        "empty first frame": [b""],
        "1 byte": [b"M"],
        "3 bytes": [b"MPL"],
        "the magic alone": [MAGIC_FRAME],
        "header too large": [MAGIC_FRAME + b"\x90" * (MAX_HEADER_BYTES + 1)],
    }


def test_the_codec_takes_one_frame_and_refuses_the_rest() -> None:
    msg = StatusRequest(7)
    wire = to_wire(encode(msg))
    assert len(wire) == 1 and wire[0][:4] == MAGIC_FRAME
    assert decode(from_wire(wire)) == msg
    refused = {}
    for what, frames in _hostile(encode(msg)[1]).items():
        with pytest.raises(ProtocolError) as caught:
            decode(from_wire(frames))
        refused[what] = str(caught.value)
    assert f"wire version {_OLD} is not supported" in refused["version 3"]
    assert f"wire version {_OLD} is not supported" in refused["version 3, sealed Exec"]
    assert "exceeds" in refused["header too large"]


def test_the_broker_process_refuses_each_and_still_serves(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    owner = cluster.client()
    sid = owner.open_session("one-frame").session
    before = owner.status()["protocol_errors"]
    ctx: zmq.Context[Any] = zmq.Context()
    attacker = Raw(ctx, cluster.address)
    try:
        hostile = _hostile(encode(StatusRequest(1))[1])
        for frames in hostile.values():
            attacker.sock.send_multipart(frames)
        refusals = []
        for _, msg in attacker.messages(20):
            if isinstance(msg, Refused):
                refusals.append(msg.error)
            if len(refusals) == len(hostile):
                break
        assert [e.kind for e in refusals] == ["ProtocolError"] * len(hostile)
        assert f"wire version {_OLD} is not supported" in refusals[0].message
        assert owner.status()["protocol_errors"] == before + len(hostile)
        attacker.send(StatusRequest(2))  # the same connection is still heard
        reply, _ = attacker.wait_for(Reply)
        assert isinstance(reply, Reply) and reply.req == 2
        b = GraphBuilder(2)
        g = b.build([b.op("constant", [], ranks=(1,), value=3)[0]])
        job = owner.submit(sid, g, {}).job  # and jobs still run
        assert owner.fetch(sid, 1, output_uri(job, 0)) == 3
    finally:
        attacker.sock.close(linger=0)
        ctx.term()


def test_the_worker_process_refuses_each_and_still_serves(tmp_path: Any) -> None:
    with worker_process(tmp_path) as (broker, proc, graph):
        hostile = _hostile(encode(Exec("s", "bad", graph.digest, (0,), {}, (0,)))[1])
        for frames in hostile.values():
            broker.send_wire(frames)
        broker.send(encode(Exec("s", "good", graph.digest, (0,), {}, (0,))))
        broker.wait_dones(1)
        assert [d.job for d in broker.dones] == ["good"] and broker.dones[0].values == {0: 5}
        wait_protocol_errors(broker, len(hostile), f"{len(hostile)} bad messages")
        assert proc.poll() is None


@pytest.mark.parametrize("what", list(_hostile(b"\x90")))
def test_the_driver_drops_each_and_takes_the_answer_after_it(what: str) -> None:
    """A fake broker answers the driver's call with a hostile message, then the answer:
    the driver takes the answer (or, for another wire version, fails at once naming it)."""

    def answer(router: zmq.Socket[Any], peer: bytes, wired: list[bytes]) -> None:
        asked = decode(from_wire(wired))
        if not isinstance(asked, StatusRequest):
            return  # the watch's heartbeats
        reply = encode(Reply(asked.req, value={"ok": 1}))
        router.send_multipart([peer, *_hostile(reply[1])[what]])
        router.send_multipart([peer, MAGIC_FRAME + reply[1]])  # then the answer

    with fake_broker(answer) as address:
        client = Client(address, timeout=10.0)
        try:
            if what.startswith("version 3"):
                with pytest.raises(ProtocolError, match=f"wire version {_OLD} is not supported"):
                    client.status()
            else:
                assert client.status() == {"ok": 1}
        finally:
            client.close()


def test_a_batch_is_one_frame_on_the_wire() -> None:
    from mpl.wire.batch import BATCH_MAGIC, batch_frames, split_batch

    headers = [encode(StatusRequest(i))[1] for i in range(3)]
    (frame,) = to_wire(batch_frames(headers))
    assert frame[:4] == BATCH_MAGIC and msgpack.unpackb(frame[4:]) == headers
    assert [one[1] for one in split_batch(from_wire([frame]))] == headers


def test_the_worker_peer_intake_refuses_each_and_takes_the_move_after_them(
    zmq_ctx: zmq.Context[Any],
) -> None:
    """A peer's PUSH to a worker's intake (the moves of a shuffle): the same first frames
    are dropped and counted, and the genuine move after them is taken."""
    mailbox = move_mailbox()
    with pushed_intake(zmq_ctx, mailbox) as (intake, [push]):
        mailbox.open(("s", "j"))
        move = encode(Move("s", "j", 0, 0, 1, 0, 7))
        hostile = _hostile(move[1])
        for frames in hostile.values():
            push.send_multipart(frames)
        push.send_multipart([MAGIC_FRAME + move[1]])  # the one-frame form, literally
        got = mailbox.take(("s", "j", 0, 0, 1, ""), time.monotonic() + 15, "the move")
        assert got == 7 and intake.errors == len(hostile)
