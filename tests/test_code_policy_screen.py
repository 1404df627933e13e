"""``--code kernels`` decodes each message once: the screen for pickles is the decode itself,
and a message holding one is still refused before anything in it is unpickled."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import pushed_intake, sealer_pair, wait_until

import mpl.wire.codec as codec
from mpl.wire import GraphBuilder, Pickled, encode
from mpl.wire.codec import to_wire
from mpl.wire.data import Move
from mpl.wire.decoder import Decoder
from mpl.wire.errors import AuthenticationError, ProtocolError
from mpl.wire.jobs import Exec, Program
from mpl.worker.code_policy import HoldsPickles, open_sealed, screen
from mpl.worker.keyed_mailbox import move_mailbox
from mpl.worker.state_events import MoveRefused

LOADED: list[str] = []  # what unpickling a Trap appended: must stay empty


def _sprung(name: str) -> str:
    LOADED.append(name)
    return name


class Trap:
    """A value whose unpickling runs code (it calls ``_sprung``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return _sprung, (self.name,)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many messages the codec decoded (one Decoder per message)."""
    count = [0]

    class Counting(Decoder):
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            count[0] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(codec, "Decoder", Counting)
    LOADED.clear()
    yield count
    LOADED.clear()


def test_a_message_without_pickles_is_decoded_once(decodes: list[int]) -> None:
    frames = encode(Move("s", "j", 0, 0, 1, 0, np.arange(3.0)))
    msg = screen(frames, "kernels", safe=False)
    assert isinstance(msg, Move) and np.array_equal(msg.value, np.arange(3.0))
    assert decodes[0] == 1


@pytest.mark.parametrize("safe", [False, True])
def test_a_message_holding_a_pickle_is_refused_unloaded(decodes: list[int], safe: bool) -> None:
    graph = GraphBuilder(1)
    graph_ = graph.build([graph.op("pcall", [], ranks=(0,), fn=graph.fn(len), args=("x",))[0]])
    for record in (
        Move("s", "j", 0, 0, 1, 0, Trap("move")),
        Exec("s", "j", "d", (0,), {0: [Trap("exec")]}, (), 5.0),
        Program("d", graph_),
    ):
        held = screen(encode(record), "kernels", safe=safe)
        assert isinstance(held, HoldsPickles) and held.opaque.TAG == record.TAG
    assert LOADED == []
    # "any" still loads it where the cluster allows pickles: the trap is a real one
    screen(encode(Move("s", "j", 0, 0, 1, 0, Trap("any"))), "any", safe=False)
    assert LOADED == ["any"]


def test_a_malformed_message_is_still_a_protocol_error() -> None:
    frames = encode(Move("s", "j", 0, 0, 1, 0, Fraction(1, 3)))
    with pytest.raises(ProtocolError):
        screen([frames[0], b"\xc1", *frames[2:]], "kernels", safe=False)


def test_the_peer_thread_decodes_each_move_once_under_code_kernels(
    zmq_ctx: zmq.Context[Any], decodes: list[int]
) -> None:
    mailbox = move_mailbox()
    refused: list[Any] = []
    with pushed_intake(zmq_ctx, mailbox, refused.append, code="kernels") as (_, [push]):
        mailbox.open(("s", "j"))
        frames = encode(Move("s", "j", 0, 0, 1, 0, np.arange(5)))
        trapped = encode(Move("s", "j", 1, 0, 1, 0, Trap("peer")))
        before = decodes[0]
        for _ in range(10):
            push.send_multipart(to_wire(frames))
        push.send_multipart(to_wire(trapped))
        wait_until(lambda: refused, 15, "the trapped move refused")
        assert mailbox.pending()[0] == 1  # the first copy of the move (the rest duplicates)
        assert decodes[0] - before == 10 + 2  # once per move; the refused one twice, opaque
        assert isinstance(refused[0], MoveRefused) and refused[0].job == "j"
        assert LOADED == []
        got = mailbox.take(("s", "j", 0, 0, 1, ""), 0.0, "lost")
        assert np.array_equal(got, np.arange(5))


def test_what_a_driver_sealed_is_decoded_once_and_its_pickles_never_loaded(
    decodes: list[int],
) -> None:
    driver, worker = sealer_pair("driver:analyst", "node:node0")
    plain = driver.seal([np.arange(3), "x"], "node:node0", "ctx", safe=False)
    before = decodes[0]
    who, value = open_sealed(worker, plain, "ctx")
    assert who == "driver:analyst" and value[1] == "x" and decodes[0] - before == 1
    trapped = driver.seal([Trap("sealed")], "node:node0", "ctx", safe=False)
    who, value = open_sealed(worker, trapped, "ctx")
    assert isinstance(value[0], Pickled) and LOADED == []
    with pytest.raises(AuthenticationError):
        open_sealed(worker, trapped, "another context")
