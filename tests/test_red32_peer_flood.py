"""Third red team w32, finding R32-3: a party floods a peer through a job they share.

Moves for a job not known yet wait in the holding area, bounded, with a fair share per
sender (``worker/holding.py``). But once the job's group is open on the receiver (its Exec
arrived, it runs), every move for it is kept at once, whatever its op and seq: the
receiver does not know which moves its program will take, and the only bound is
``MAX_MOVES_PENDING`` entries over all groups, with no bound in bytes and no share per
sender. A party taking part in any job with the receiver knows its session, job id and
sealer (it runs the same job), and its connection proves only its own rank, which is all
a move needs. So, holding its own node key:

* it keeps, for as long as the job runs (it delays its own genuine move until the job's
  deadline, 600 s by default), any number of bytes in the receiver's memory: moves of up
  to ``MAX_MESSAGE`` (4 GiB) each, under op numbers the program never reads;
* it fills the ``MAX_MOVES_PENDING`` entries, after which every other party's genuine
  move, for any job of any driver, is dropped (``overflow``) and that job fails.

The same holds for the SPU link, for the life of a session (a lane lives that long),
within a bound of 100,000 messages and 4 GiB shared by every lane.

The tests use a raw CURVE PUSH holding the party's key against a real peer intake and a
real SPU link.
They are strict xfails: the fix is not local. The receiver should keep, in an open group,
only the moves its program will take (the graph says which ops move a value from which
source to this rank, and how many times a loop repeats them), counted against the job,
and refuse the rest as a protocol error charged to the sender; failing that, open groups
need a per-sender share of entries and bytes like the holding area's, which must not
drop a genuine big move (promise 6: a 1 GiB move).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import wait_until

from mpl.wire import ClusterSpec, encode
from mpl.wire.codec import to_wire
from mpl.wire.curve import Curve, peer_admits
from mpl.wire.data import Move
from mpl.wire.graph import Graph, GraphBuilder
from mpl.wire.keys import KeyPair
from mpl.wire.sockets import MAX_MESSAGE, configure
from mpl.wire.zap import Gatekeeper
from mpl.worker.holding import held_moves, held_spu
from mpl.worker.keyed_mailbox import KeyedMailbox, MoveKey, move_mailbox, spu_mailbox
from mpl.worker.move_keys import MoveSlot, moves_in
from mpl.worker.peer_intake import PeerIntake
from mpl.worker.spu_link import SPU_MAGIC, SpuLinks


def _pair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public.decode("ascii"), secret.decode("ascii"))


class _Rank0:
    """Rank 0's peer intake in a secure 3-party cluster, and PUSHes holding ranks 1 and 2's
    own node keys (rank 2 is the hostile party)."""

    def __init__(self, ctx: zmq.Context[Any], max_entries: int | None = None) -> None:
        pairs = [_pair() for _ in range(3)]
        spec = ClusterSpec.simple(3).with_keys(
            _pair().public, [p.public for p in pairs], {"analyst": _pair().public}
        )
        node0 = Curve(pairs[0], spec)
        self.gatekeeper = Gatekeeper(ctx, peer_admits(spec))
        self.gatekeeper.start()
        self.mailbox: KeyedMailbox[MoveKey, tuple[str, str]] = move_mailbox(
            held_moves(node0, lambda: 0), max_entries=max_entries
        )
        self.intake = PeerIntake(
            ctx, "tcp://127.0.0.1:0", 0, self.mailbox, lambda event: None,
            curve=node0, trusted=False, code="any", max_message=MAX_MESSAGE,
        )  # fmt: skip
        self.intake.start()
        self.push: dict[int, zmq.Socket[Any]] = {}
        for rank in (1, 2):
            sock = configure(ctx.socket(zmq.PUSH), linger_ms=1000)
            Curve(pairs[rank], spec).dial(sock, pairs[0].public)
            sock.connect(self.intake.address)
            self.push[rank] = sock

    def send(self, src: int, move: Move) -> None:
        self.push[src].send_multipart(to_wire(encode(move)))

    def close(self) -> None:
        for sock in self.push.values():
            sock.close()
        self.intake.stop(5)
        self.intake.close()
        self.gatekeeper.stop()


def _shuffled(pairs: dict[int, int], pad: int) -> Graph:
    """A 3-party graph whose op ``pad + 1`` moves a value to each ``dst`` from its ``src``."""
    b = GraphBuilder(3)
    for _ in range(pad):
        b.op("constant", [], ranks=(0,), value=0)
    x = b.op("constant", [], ranks=tuple(sorted(set(pairs.values()))), value=1)[0]
    b.op("shuffle", [x], ranks=tuple(sorted({*pairs, *pairs.values()})), routing=pairs)
    return b.build([])


def _takes(graph: Graph, rank: int) -> frozenset[MoveSlot]:
    """What the worker's Expect opens the job's group with (WorkerState._exec)."""
    state_takes = moves_in(graph, rank)
    assert state_takes  # the job does take a move here
    return state_takes


_SHARED = _shuffled({0: 2}, 0)  # op 1: rank 0 takes one move from rank 2
_OTHER = _shuffled({0: 1}, 2)  # op 3: rank 0 takes one move from rank 1


@pytest.fixture
def rank0(zmq_ctx: zmq.Context[Any]) -> Iterator[_Rank0]:
    with contextlib.closing(_Rank0(zmq_ctx)) as made:
        yield made


def test_a_party_cannot_park_unbounded_bytes_in_a_job_it_shares(rank0: _Rank0) -> None:
    # rank 0 runs a job in which rank 2 takes part, opened as its Expect opens it
    rank0.mailbox.open(("s", "shared"), _takes(_SHARED, 0))
    chunk = np.zeros(1 << 20, dtype=np.uint8)  # 1 MiB a move; MAX_MESSAGE allows 4 GiB
    parked = 96
    for op in range(1000, 1000 + parked):  # ops the program never reads
        rank0.send(2, Move("s", "shared", op, 0, 2, 0, chunk))
    seen = rank0.mailbox
    wait_until(lambda: seen.pending()[0] + seen.dropped >= parked, 30, "the moves to arrive")
    # what a job's program does not take should not be kept: at most a small bound
    assert seen.pending()[0] < parked // 2, f"{seen.pending()[0]} unclaimed moves kept"


def test_a_party_flooding_a_shared_job_leaves_room_for_another_partys_move(
    zmq_ctx: zmq.Context[Any],
) -> None:
    rank0 = _Rank0(zmq_ctx, max_entries=200)  # MAX_MOVES_PENDING is 100,000: same shape
    try:
        rank0.mailbox.open(("s", "shared"), _takes(_SHARED, 0))  # a job rank 2 takes part in
        flood = 300
        for op in range(flood):
            rank0.send(2, Move("s", "shared", 5000 + op, 0, 2, 0, b"x"))
        box = rank0.mailbox
        # refused as moves the program does not take (unexpected, in dropped)
        wait_until(lambda: box.pending()[0] + box.dropped >= flood, 30, "the flood taken")
        # another driver's job, between ranks 1 and 0 only: its genuine move arrives
        rank0.mailbox.open(("t", "other"), _takes(_OTHER, 0))
        rank0.send(1, Move("t", "other", 3, 0, 1, 0, np.arange(4.0)))
        deadline = time.monotonic() + 10
        got = rank0.mailbox.take(("t", "other", 3, 0, 1, ""), deadline, "rank 1's move was dropped")
        assert np.array_equal(got, np.arange(4.0))
    finally:
        rank0.close()


def test_an_spu_member_flooding_its_lane_leaves_room_for_another_lane(
    zmq_ctx: zmq.Context[Any],
) -> None:
    """The SPU link's variant: a lane lives as long as its session, and keeps every
    message a co-member sends under any libspu key, within one bound shared by all lanes
    (MAX_SPU_PENDING, 100,000 messages and 4 GiB; 200 here). So a member parks up to 4 GiB
    in a peer for a whole session, and past the bound every other lane's messages (other
    drivers' SPU sessions) are dropped."""
    pairs = [_pair() for _ in range(3)]
    spec = ClusterSpec.simple(3).with_keys(
        _pair().public, [p.public for p in pairs], {"analyst": _pair().public}
    )
    gatekeeper = Gatekeeper(zmq_ctx, peer_admits(spec))
    gatekeeper.start()
    links = SpuLinks(
        zmq_ctx, "tcp://127.0.0.1:0", 0, dict, curve=Curve(pairs[0], spec), start=False
    )
    # MAX_SPU_PENDING is 100,000: same shape (its holding area as the daemon makes it)
    links.mailbox = spu_mailbox(held_spu(Curve(pairs[0], spec), lambda: 0), max_entries=200)
    links.start()
    push: dict[int, zmq.Socket[Any]] = {}
    try:
        for rank in (1, 2):
            sock = configure(zmq_ctx.socket(zmq.PUSH), linger_ms=1000)
            Curve(pairs[rank], spec).dial(sock, pairs[0].public)
            sock.connect(links.address)
            push[rank] = sock
        links.open_lane("s~x/SP0/ab/0")  # a session rank 2 is a member of
        flood = 300
        for i in range(flood):  # keys libspu never asks for
            push[2].send_multipart([SPU_MAGIC, b"s~x/SP0/ab/0", b"2", f"junk{i}".encode(), b"x"])
        box = links.mailbox
        wait_until(lambda: box.pending()[0] + box.overflow >= flood, 30, "the flood taken")
        links.open_lane("t~y/SP0/ab/0")  # another driver's session, of ranks 0 and 1
        push[1].send_multipart([SPU_MAGIC, b"t~y/SP0/ab/0", b"1", b"k", b"genuine"])
        got = links.recv("t~y/SP0/ab/0", 1, "k", ("t~y", "j"), time.monotonic() + 10)
        assert got == b"genuine"
    finally:
        for sock in push.values():
            sock.close()
        links.close()
        gatekeeper.stop()


def test_a_party_cannot_park_moves_under_its_own_slot_by_naming_other_sealers(
    rank0: _Rank0,
) -> None:
    """Review of R32-3: a group keeps only the (op, seq, src) its program takes, but a
    move's key also holds its ``sealer``, the sender's word (wire/data.py's Move). A party
    that sends the one move the program takes from it under many made-up sealers would
    have each kept as a key of its own until the job ends: one value per slot is all a
    genuine sender sends, so a second (any sealer) is refused as unexpected."""
    rank0.mailbox.open(("s", "shared"), _takes(_SHARED, 0))  # op 1, seq 0, from rank 2
    parked = 50
    for i in range(parked):
        rank0.send(2, Move("s", "shared", 1, 0, 2, 0, b"x", f"driver:fake{i}"))
    seen = rank0.mailbox
    wait_until(lambda: seen.pending()[0] + seen.dropped >= parked, 30, "the moves to arrive")
    assert seen.pending()[0] == 1, f"{seen.pending()[0]} moves kept for one slot"
    assert seen.unexpected == parked - 1
    assert rank0.intake.errors == parked - 1  # each charged to rank 2 as a protocol error


def test_a_genuine_move_sent_twice_is_a_duplicate_not_a_sealer_flood(rank0: _Rank0) -> None:
    """The same key twice (a resent move) stays a duplicate, not the sender's error; the
    value is taken as before."""
    rank0.mailbox.open(("s", "shared"), _takes(_SHARED, 0))
    for _ in range(2):
        rank0.send(2, Move("s", "shared", 1, 0, 2, 0, b"v", "driver:analyst"))
    seen = rank0.mailbox
    wait_until(lambda: seen.pending()[0] + seen.duplicates >= 2, 30, "both copies")
    assert (seen.pending()[0], seen.duplicates, seen.unexpected) == (1, 1, 0)
    assert rank0.intake.errors == 0
    key = ("s", "shared", 1, 0, 2, "driver:analyst")
    assert seen.take(key, time.monotonic() + 10, "the move was dropped") == b"v"


def test_one_oversized_spu_message_leaves_room_for_another_senders_share() -> None:
    """Review of R32-3's SPU shares: one value bigger than its sender's byte share fits
    while that sender has nothing else waiting (a genuine big message), but it took room
    another sender's share needs, the bound over all senders being checked first: in a
    3-rank world of 300 bytes (a share of 100 each), rank 2 kept 250 bytes in its lane
    and rank 1's 60 bytes, within its share, were refused. (MAX_SPU_PENDING_BYTES and
    MAX_MESSAGE are both 4 GiB: rank 2 could keep up to either.) Now a big value fits in
    the room no other sender's share needs (rank 0, the receiver, sends it nothing)."""
    box = spu_mailbox(held_spu(None, lambda: 3), max_entries=100, max_bytes=300, own=0)
    box.open("lane")
    assert not box.put(("lane", 2, "k"), b"x" * 250)  # would leave rank 1 50 of its 100
    assert box.over_share[2] == 1
    assert box.put(("lane", 2, "k"), b"x" * 200)  # alone, twice its share: still kept
    assert box.put(("lane", 1, "k"), b"y" * 60)  # within rank 1's share of 100
    assert box.put(("lane", 1, "k"), b"y" * 40)  # all of it
    assert box.pending() == (3, 300)
    assert not box.put(("lane", 2, "k"), b"x")  # rank 2 is over its share already


def test_an_oversized_spu_message_fits_past_its_share_once_others_are_within_theirs() -> None:
    """What another sender already holds is not kept free twice: with rank 1's share in
    use, rank 2's big value may take what is left."""
    box = spu_mailbox(held_spu(None, lambda: 3), max_entries=100, max_bytes=300, own=0)
    box.open("lane")
    assert box.put(("lane", 1, "k"), b"y" * 100)
    assert box.put(("lane", 2, "k"), b"x" * 200)
    assert box.pending() == (2, 300)
