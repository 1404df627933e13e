"""The holding area gives each sender a fair share: one party flooding it with traffic for
jobs that will never exist cannot make another party's genuine early move be dropped."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import pushed_intake, wait_until
from test_worker_loop import FakeBroker

from mpl.wire import ClusterSpec, GraphBuilder, encode
from mpl.wire.codec import to_wire
from mpl.wire.control import Welcome
from mpl.wire.curve import Curve, peer_admits
from mpl.wire.data import Move
from mpl.wire.jobs import Done, Exec, Failed, Program
from mpl.wire.keys import KeyPair
from mpl.wire.sockets import MAX_MESSAGE, configure
from mpl.wire.zap import Gatekeeper
from mpl.worker.daemon import Worker
from mpl.worker.holding import Holding, held_moves, held_spu
from mpl.worker.keyed_mailbox import move_mailbox, spu_mailbox
from mpl.worker.peer_intake import PeerIntake


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ALICE, BOB, MALLORY = 0, 1, 2  # ranks of a world of three


def _by_first(key: Any) -> Any:
    return key[0]


def _three() -> int:
    return 3


def test_a_flooding_sender_cannot_take_another_senders_room() -> None:
    held = Holding(max_entries=30, max_bytes=1 << 20, sender_of=_by_first, senders=_three)
    assert held.share() == (10, (1 << 20) // 3)
    flood = [held.hold(f"ghost{i}", (MALLORY, i), i) for i in range(100)]
    assert flood.count(True) == 30 and held.over_share[MALLORY] == 70  # free room only
    assert held.hold("real", (ALICE, 0), "early move")  # its share is there: mallory gives
    assert held.hold("real", (BOB, 0), "early move")
    assert held.entries == 30 and held.held_by(MALLORY)[0] == 28
    assert held.over_share[MALLORY] == 72 and held.dropped == 72
    assert not held.holds("ghost29", (MALLORY, 29))  # the newest of the flood went first
    assert all(held.hold(f"a{i}", (ALICE, i), i) for i in range(1, 10))  # alice's 10
    assert not held.hold("a10", (ALICE, 10), 10)  # past its share, with the area full
    assert held.over_share[ALICE] == 1 and held.held_by(MALLORY)[0] == 19
    assert held.release("real") == [((ALICE, 0), "early move"), ((BOB, 0), "early move")]
    assert held.held_by(BOB) == (0, 0) and held.entries == 28


def test_a_senders_bytes_are_its_share_too() -> None:
    held = Holding(max_entries=300, max_bytes=3000, sender_of=_by_first, senders=_three)
    assert all(held.hold("g", (MALLORY, i), b"x" * 1000) for i in range(3))  # all free room
    assert not held.hold("g", (MALLORY, 3), b"x")
    assert held.hold("real", (ALICE, 0), b"y" * 1000)  # within its 1,000 bytes
    assert held.nbytes == 3000 and held.held_by(MALLORY) == (2, 2000)
    assert not held.hold("real", (ALICE, 1), b"y")  # past its share: nothing is reclaimed
    assert held.over_share[MALLORY] == 2 and held.over_share[ALICE] == 1


def test_one_big_early_move_waits_while_nobody_needs_the_room() -> None:
    held = Holding(max_entries=30, max_bytes=3000, sender_of=_by_first, senders=_three)
    assert held.hold("real", (ALICE, 0), b"y" * 2500)  # more than a share: room is free
    assert held.hold("other", (BOB, 0), b"z" * 400)
    assert held.hold("third", (MALLORY, 0), b"w" * 900)  # within its share: alice's goes
    assert not held.holds("real", (ALICE, 0)) and held.over_share[ALICE] == 1
    assert held.nbytes == 1300


def test_sources_that_are_no_rank_of_the_world_get_nothing() -> None:
    held = Holding(max_entries=30, sender_of=_by_first, senders=_three)
    kept = [held.hold(f"g{i}", (src, 0), i) for i, src in enumerate([3, 99, -1, "1", 1.0, 2])]
    assert kept == [False] * 5 + [True]  # plaintext: claimed sources outside the world
    assert held.hold("g9", (ALICE, 0), 0) and held.dropped == 5


def test_the_totals_stay_bounded_whatever_the_senders() -> None:
    held = Holding(max_entries=8, max_bytes=1 << 20, sender_of=_by_first, senders=lambda: 2)
    for sender in (0, 1, 2):
        for i in range(10):
            held.hold(f"{sender}/{i}", (sender, i), np.zeros(4))
            assert held.entries <= 8
    assert held.held_by(0)[0] == 4 and held.held_by(1)[0] == 4
    assert held.dropped == 22  # 0: 2 past the area, 4 given to 1; 1: 6; 2: no rank of two


def test_expiry_frees_a_senders_room() -> None:
    clock = Clock()
    held = Holding(max_entries=6, hold_s=5.0, clock=clock, sender_of=_by_first, senders=_three)
    assert [held.hold("g", (MALLORY, i), i) for i in range(7)] == [True] * 6 + [False]
    clock.now = 6.0
    assert held.hold("g2", (MALLORY, 9), 9)  # the old ones expired
    assert held.entries == 1 and held.held_by(MALLORY)[0] == 1
    assert held.dropped == 7  # one past the area, six expired


def test_until_the_ranks_are_known_only_the_totals_apply() -> None:
    world = [0]
    held = Holding(max_entries=12, sender_of=_by_first, senders=lambda: world[0])
    assert all(held.hold(f"g{i}", (MALLORY, i), i) for i in range(12))
    assert not held.hold("g0", (ALICE, 0), 0)  # full, and no share to claim yet
    world[0] = 3
    assert held.hold("g9", (ALICE, 0), 0) and held.held_by(MALLORY)[0] == 11


def test_moves_and_spu_messages_are_charged_to_their_source() -> None:
    moves = move_mailbox(held_moves(None, _three))
    for i in range(2000):
        moves.put(("s", f"ghost{i}", 0, 0, 2, ""), i)  # rank 2 floods jobs that never come
    assert moves.put(("s", "real", 0, 0, 1, ""), "early")  # rank 1's move still finds room
    moves.open(("s", "real"))
    assert moves.take(("s", "real", 0, 0, 1, ""), 0.0, "late") == "early"
    spu = spu_mailbox(held_spu(None, _three))
    for i in range(2000):
        spu.put((f"ghost/{i}", 2, "k"), b"x")
    assert spu.put(("lane", 1, "k"), b"early")
    spu.open("lane")
    assert spu.take(("lane", 1, "k"), 0.0, "late") == b"early"


def test_in_secure_mode_the_ranks_come_from_this_partys_own_spec() -> None:
    spec = _spec(3)
    curve = Curve(_pair(), spec)
    assert held_moves(curve, lambda: 1000).share() == held_moves(None, _three).share()


# -- a raw CURVE socket with one party's key floods a real peer intake ---------------------


def _pair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public.decode("ascii"), secret.decode("ascii"))


def _spec(world: int, pairs: list[KeyPair] | None = None) -> ClusterSpec:
    pairs = pairs or [_pair() for _ in range(world)]
    return ClusterSpec.simple(world).with_keys(
        _pair().public, [p.public for p in pairs], {"analyst": _pair().public}
    )


def test_a_party_flooding_forged_moves_leaves_room_for_another_partys_early_move(
    zmq_ctx: zmq.Context[Any], caplog: pytest.LogCaptureFixture
) -> None:
    pairs = [_pair() for _ in range(3)]
    spec = _spec(3, pairs)
    node0 = Curve(pairs[0], spec)
    gatekeeper = Gatekeeper(zmq_ctx, peer_admits(spec))
    gatekeeper.start()
    mailbox = move_mailbox(held_moves(node0, lambda: 0))
    intake = PeerIntake(
        zmq_ctx,
        "tcp://127.0.0.1:0",
        0,
        mailbox,
        lambda event: None,
        curve=node0,
        trusted=False,
        code="any",
        max_message=MAX_MESSAGE,
    )
    socks: list[zmq.Socket[Any]] = []
    try:
        intake.start()
        for rank in (1, 2):
            sock = configure(zmq_ctx.socket(zmq.PUSH), linger_ms=1000)
            Curve(pairs[rank], spec).dial(sock, pairs[0].public)
            sock.connect(intake.address)
            socks.append(sock)
        rank1, rank2 = socks
        flood = 1500  # more than the whole area (1,024) and the intake's second chances
        for i in range(flood):  # rank 2, speaking as itself, for jobs that will never exist
            rank2.send_multipart(
                to_wire(encode(Move("s", f"ghost{i}", 0, 0, 2, 0, np.arange(3.0))))
            )
        wait_until(
            lambda: mailbox.held() + mailbox.held_dropped >= flood,
            timeout=30,
            what="rank 0 to take the whole flood",
        )
        flooded = mailbox.held()  # rank 2 took the free room
        # rank 1's genuine move overtakes the Exec of its real job
        rank1.send_multipart(to_wire(encode(Move("s", "real", 0, 0, 1, 0, np.arange(4.0)))))
        wait_until(lambda: mailbox.held() + mailbox.held_dropped > flood, 15, "the early move")
        mailbox.open(("s", "real"))  # the Exec arrives: the job takes its move and completes
        got = mailbox.take(("s", "real", 0, 0, 1, ""), 0.0, "the early move was dropped")
        assert np.array_equal(got, np.arange(4.0))
        assert flooded == 1024 and mailbox.held() == 1023  # rank 2 gave back what was needed
        dropped = [r.getMessage() for r in caplog.records if "holding area" in r.getMessage()]
        assert len(dropped) == 1 and dropped[0].startswith("refused rank 2:")  # once, by rank
    finally:
        for sock in socks:
            sock.close()
        intake.stop(5)
        intake.close()
        gatekeeper.stop()


def test_a_worker_runs_a_job_whose_early_move_came_amid_another_partys_flood(
    zmq_ctx: zmq.Context[Any],
) -> None:
    """The worker learns the world size from its broker (plaintext: only the claimed source
    tells the senders apart) and shares its holding area by it."""
    broker = FakeBroker(zmq_ctx)
    worker = Worker(broker.address, 0, context=zmq_ctx, heartbeat_s=0.5).start()
    socks: list[zmq.Socket[Any]] = []

    def hello_seen() -> Any:
        broker.pump(50)
        return broker.peer

    try:
        wait_until(hello_seen, 10, "the worker's hello")
        broker.send(Welcome(0, 3, "fake-broker", 0.5, {}))
        assert worker.joined.wait(10), "the worker did not join the fake broker"
        for _ in range(2):
            sock = configure(zmq_ctx.socket(zmq.PUSH), linger_ms=0)
            sock.connect(worker.data_addr)
            socks.append(sock)
        flood = 1500
        for i in range(flood):  # "rank 2": moves for jobs that will never exist
            socks[1].send_multipart(to_wire(encode(Move("s1", f"ghost{i}", 1, 0, 2, 0, b"x"))))
        box = worker.mailbox
        wait_until(lambda: box.held() + box.held_dropped >= flood, 30, "the flood taken")
        b = GraphBuilder(3)
        x = b.op("constant", [], ranks=(1,), value=7)[0]
        y = b.op("shuffle", [x], ranks=(1, 0), routing={0: 1})[0]
        graph = b.build([y])
        # rank 1's move for op 1 of job j1 overtakes the job's Exec
        socks[0].send_multipart(to_wire(encode(Move("s1", "j1", 1, 0, 1, 0, 7))))
        wait_until(lambda: box.held() + box.held_dropped > flood, 15, "the early move")
        broker.send(Program(graph.digest, graph))
        broker.send(Exec("s1", "j1", graph.digest, (0, 1), {}, (0,), 10.0))

        def ended() -> Any:
            broker.pump(50)
            return [m for m in broker.heard if isinstance(m, (Done, Failed)) and m.job == "j1"]

        (end,) = wait_until(ended, 20, "job j1 to end on rank 0")
        assert isinstance(end, Done) and end.values == {0: 7}
    finally:
        for sock in socks:
            sock.close()
        worker.stop()
        worker.join(10)
        broker.router.close(linger=0)


def test_a_flood_leaves_room_in_the_peer_threads_second_chances(zmq_ctx: zmq.Context[Any]) -> None:
    """A move the holding area has no room for is put once more after the I/O thread's next
    message (it may have overtaken an Exec queued there); one sender's flood takes at most
    a quarter of those second chances."""

    def sender_of(held: Any) -> Hashable:
        src: Hashable = held[0][4]
        return src

    holding = Holding(max_entries=6, sender_of=sender_of, senders=_three)
    mailbox = move_mailbox(holding)
    with pushed_intake(zmq_ctx, mailbox, peers=2) as (intake, push):
        for i in range(400):  # rank 2 floods: 6 held, the rest refused
            push[1].send_multipart(to_wire(encode(Move("s", f"ghost{i}", 0, 0, 2, 0, i))))
        wait_until(lambda: mailbox.held_dropped >= 394, 15, "the flood refused")
        for op in range(3):  # rank 1: two within its share, the third over it
            push[0].send_multipart(to_wire(encode(Move("s", "real", op, 0, 1, 0, op))))
        wait_until(lambda: mailbox.held_dropped >= 394 + 3, 15, "rank 1's moves")
        mailbox.open(("s", "real"))  # the Exec was handled...
        intake.put_deferred()  # ...and the I/O thread gives the refused moves their chance
        got = [mailbox.take(("s", "real", op, 0, 1, ""), 0.0, f"op {op} lost") for op in range(3)]
        assert got == [0, 1, 2]
