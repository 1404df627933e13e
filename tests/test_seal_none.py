"""A sealed None (``mpl.wire.seal``): the bindings of every rank a job gives no inputs travel
as a compact box's head and nonce with a keyed-BLAKE2b tag instead of a ciphertext. It must
stay exactly as bound as any box: to its sender, its recipient and its context (the job),
and nothing else may pass for it."""

from __future__ import annotations

import pytest
import zmq
from helpers import compact_box, sealer_pair

from mpl.wire.errors import AuthenticationError
from mpl.wire.jobs import Exec, Failed
from mpl.wire.seal import Sealer, exec_context
from mpl.wire.sealed import BOX_MAGIC, is_sealed
from mpl.worker.sealing import WorkerSeal

_HEAD = len(BOX_MAGIC) + 1  # then the sender's name, the 16-byte epoch, the 12-byte nonce
_CONTEXT = exec_context("s", "job1", "d", (0, 1), (0,), 5.0)


class Parties:
    def __init__(self) -> None:
        keys = {n: zmq.curve_keypair() for n in ("driver:a", "driver:b", "node:n0", "node:n1")}
        public = {n: k[0].decode() for n, k in keys.items()}
        drivers = {n: k for n, k in public.items() if n.startswith("driver:")}
        nodes = {n: k for n, k in public.items() if n.startswith("node:")}
        self.a = Sealer(keys["driver:a"][1].decode(), "driver:a", nodes)
        self.b = Sealer(keys["driver:b"][1].decode(), "driver:b", nodes)
        self.n0 = Sealer(keys["node:n0"][1].decode(), "node:n0", drivers)
        self.n1 = Sealer(keys["node:n1"][1].decode(), "node:n1", drivers)


@pytest.fixture
def parties() -> Parties:
    return Parties()


def _end(box: bytes) -> int:
    """Where a box's epoch ends (its nonce starts)."""
    return _HEAD + box[_HEAD - 1] + 16


def test_a_sealed_none_is_a_tag_alone(parties: Parties) -> None:
    nothing = parties.a.seal(None, "node:n0", _CONTEXT, safe=False)
    assert type(nothing) is bytes and is_sealed(nothing)
    assert len(nothing) == _end(nothing) + 12 + 16  # nonce and tag, no ciphertext
    assert parties.n0.open(nothing, _CONTEXT) == ("driver:a", None)
    # a one-byte value still gets a ciphertext: the two lengths never meet
    zero = compact_box(parties.a.seal(0, "node:n0", _CONTEXT, safe=False))
    assert len(zero) > _end(zero) + 12 + 16


def test_a_sealed_none_opens_only_for_its_job_recipient_and_sender(parties: Parties) -> None:
    a, n0, n1 = parties.a, parties.n0, parties.n1
    nothing = compact_box(a.seal(None, "node:n0", _CONTEXT, safe=False))
    other_job = exec_context("s", "job2", "d", (0, 1), (0,), 5.0)
    other_ranks = exec_context("s", "job1", "d", (0,), (0,), 5.0)
    for context in (other_job, other_ranks, "done|s|job1|0"):
        with pytest.raises(AuthenticationError, match="replayed"):
            n0.open(nothing, context)
    with pytest.raises(AuthenticationError, match="failed authentication"):
        n1.open(nothing, _CONTEXT)  # sealed for node n0, handed to n1
    name = b"driver:b"
    renamed = BOX_MAGIC + bytes([len(name)]) + name + nothing[_HEAD + nothing[_HEAD - 1] :]
    with pytest.raises(AuthenticationError, match="failed authentication"):
        n0.open(renamed, _CONTEXT)  # under another listed driver's name
    with pytest.raises(AuthenticationError, match="claims to be sealed by"):
        n0.open(nothing, _CONTEXT, sender="driver:b")
    # once its epoch is known (a cache hit), it is bound all the same
    assert n0.open(nothing, _CONTEXT) == ("driver:a", None)
    again = a.seal(None, "node:n0", _CONTEXT, safe=False)
    with pytest.raises(AuthenticationError, match="replayed"):
        n0.open(again, other_job)
    with pytest.raises(AuthenticationError, match="claims to be sealed by"):
        n0.open(again, _CONTEXT, sender="driver:b")


@pytest.mark.parametrize("where", ["magic", "epoch", "nonce", "tag", "longer", "shorter"])
def test_any_alteration_of_a_sealed_none_fails(parties: Parties, where: str) -> None:
    nothing = bytearray(compact_box(parties.a.seal(None, "node:n0", _CONTEXT, safe=False)))
    end = _end(bytes(nothing))
    if where == "magic":
        nothing[0] ^= 1
    elif where == "epoch":
        nothing[end - 1] ^= 1
    elif where == "nonce":
        nothing[end + 11] ^= 1
    elif where == "tag":
        nothing[-1] ^= 1
    elif where == "longer":  # now read as a box with a one-byte ciphertext
        nothing.append(0)
    else:
        del nothing[-1]
    with pytest.raises(AuthenticationError):
        parties.n0.open(bytes(nothing), _CONTEXT)


def test_no_box_passes_for_a_sealed_none_nor_the_other_way(parties: Parties) -> None:
    """A box cut to a None's length meets the tag key (which only its sealer holds), and a
    None's tag read as a ciphertext meets the cipher."""
    box = compact_box(parties.a.seal(0, "node:n0", _CONTEXT, safe=False))
    cut = box[: _end(box) + 12] + box[-16:]  # its nonce and its own Poly1305 tag
    with pytest.raises(AuthenticationError, match="failed authentication"):
        parties.n0.open(cut, _CONTEXT)
    nothing = compact_box(parties.a.seal(None, "node:n0", _CONTEXT, safe=False))
    with pytest.raises(AuthenticationError, match="failed authentication"):
        parties.n0.open(nothing + nothing[-16:], _CONTEXT)


def test_forged_sealed_nones_keep_no_epoch(parties: Parties) -> None:
    n0 = parties.n0
    nothing = compact_box(parties.a.seal(None, "node:n0", _CONTEXT, safe=False))
    end = _end(nothing)
    for i in range(20):
        forged = nothing[: end - 16] + i.to_bytes(16, "big") + nothing[end:]
        with pytest.raises(AuthenticationError):
            n0.open(forged, _CONTEXT)
    assert n0._receiving == {}
    n0.open(nothing, _CONTEXT)
    assert len(n0._receiving) == 1


def test_a_worker_refuses_another_ranks_or_another_jobs_sealed_none(parties: Parties) -> None:
    """A broker that moves rank 1's sealed None to rank 0, or replays a job's None into a
    job of its own, starts nothing."""
    context = exec_context("s", "j1", "d", (0, 1), (), 5.0)
    for_n1 = parties.a.seal(None, "node:n1", context, safe=False)
    for_n0 = parties.a.seal(None, "node:n0", context, safe=False)
    rank0 = WorkerSeal(parties.n0, 0)
    opened, answer = rank0.inbound(Exec("s", "j1", "d", (0, 1), {0: for_n1}, (), 5.0))
    assert opened is None and isinstance(answer, Failed)
    assert answer.error.kind == "AuthenticationError"
    opened, answer = rank0.inbound(Exec("s", "j2", "d", (0, 1), {0: for_n0}, (), 5.0))
    assert opened is None and isinstance(answer, Failed)
    assert rank0.refusals == 2
    opened, answer = rank0.inbound(Exec("s", "j1", "d", (0, 1), {0: for_n0}, (), 5.0))
    assert answer is None and isinstance(opened, Exec) and opened.bindings == {}
    opened, answer = rank0.inbound(Exec("s", "j1", "d", (0, 1), {0: for_n0}, (), 5.0))
    assert opened is None and isinstance(answer, Failed)  # the same job again: a replay


def test_a_jobs_nones_sealed_in_one_call_are_each_bound_to_their_own_recipient(
    parties: Parties,
) -> None:
    """Sealer.seal_nones (a job's every rank without inputs, one call): each rank's box is
    sealed for that rank's node alone and that rank's context (the job's, then its own
    suffix), numbered by that node's epoch as seal() numbers it, and opens nowhere else nor
    for any other context."""
    a, n0, n1 = parties.a, parties.n0, parties.n1
    before = a.seal(None, "node:n0", _CONTEXT, safe=False)
    assert isinstance(before, bytes)  # a sealed None is a compact box
    targets = {0: ("node:n0", b""), 1: ("node:n1", b"|i1")}
    boxes = a.seal_nones(targets, (0, 1), _CONTEXT.encode())
    assert list(boxes) == [0, 1]
    assert n0.open(boxes[0], _CONTEXT) == ("driver:a", None)
    assert n1.open(boxes[1], _CONTEXT + "|i1") == ("driver:a", None)  # its own context
    with pytest.raises(AuthenticationError, match="replayed"):
        n1.open(boxes[1], _CONTEXT)
    for node, box in ((n1, boxes[0]), (n0, boxes[1])):  # the other node's: its key fails
        with pytest.raises(AuthenticationError):
            node.open(box, _CONTEXT)
    with pytest.raises(AuthenticationError, match="replayed"):
        n0.open(boxes[0], exec_context("s", "job2", "d", (0, 1), (0,), 5.0))
    # node:n0's epoch numbers it right after the None seal() made just before
    end = _end(before)
    assert boxes[0][:end] == before[:end]
    assert int.from_bytes(boxes[0][end : end + 12]) == int.from_bytes(before[end : end + 12]) + 1
    with pytest.raises(KeyError):  # a rank with no identity: the caller says why
        a.seal_nones({0: ("node:n0", b"")}, (0, 2), _CONTEXT.encode())


def test_a_sealed_nones_tag_input_fits_one_blake2b_block() -> None:
    """A sealed None's tag is BLAKE2b over its 32-byte key, its nonce and its context
    (prefix-keyed, ``mpl.wire.seal_box``): one compression while the three fit one 128-byte
    block. With the session and the Exec's fields after the job hashed into a short tail
    (``ExecTails``), they fit for a job as a driver numbers it in a session as a broker
    names it (``<name>~<16 hex>``, the name a driver's own ``s<16 hex>``): written out, the
    session alone (34 bytes) would push them to two."""
    session = "s" + "5" * 16 + "~" + "6" * 16  # a broker's id for a session a driver named
    context = exec_context(
        session,
        "a" * 24,  # a driver's job id (_JobIds)
        "d" * 64,  # a program's sha256 digest
        (0, 1, 2, 3),
        (0, 1),
        3600.0,
        "c" * 16,  # a worker's public incarnation
    )
    assert 32 + 12 + len(context.encode()) <= 128  # the key, the nonce, then the context
    # still bound to every field the tail stands for
    others = [
        exec_context(sid, "a" * 24, digest, ranks, inline, timeout, "c" * 16)
        for sid, digest, ranks, inline, timeout in (
            (session, "e" * 64, (0, 1, 2, 3), (0, 1), 3600.0),
            (session, "d" * 64, (0, 1, 2), (0, 1), 3600.0),
            (session, "d" * 64, (0, 1, 2, 3), (0,), 3600.0),
            (session, "d" * 64, (0, 1, 2, 3), (0, 1), 3601.0),
            (session[:-1] + "7", "d" * 64, (0, 1, 2, 3), (0, 1), 3600.0),
            # the same text split otherwise between session and digest
            (session + "|64:" + "d" * 64, "", (0, 1, 2, 3), (0, 1), 3600.0),
        )
    ]
    assert len({context, *others}) == 7


def test_a_sealed_none_or_box_of_one_session_does_not_open_in_another() -> None:
    """The session is bound through the Exec context's hashed tail, not written out: a
    sealed None or bindings box of a job in one session, replayed as the same job id of
    another session (or for another incarnation), fails its tag at the worker, by its full
    path and by its short path (the stream's Nones known)."""
    driver, node = sealer_pair()
    worker = WorkerSeal(node, 0, incarnation="c" * 16)

    def context(session: str, job: str, incarnation: str = "c" * 16) -> str:
        return exec_context(session, job, "d", (0,), (0,), 5.0, incarnation)

    def exec_of(session: str, job: str) -> Exec:
        return Exec(session, job, "d", (0,), {}, (0,), 5.0)

    mine, theirs = "s1~" + "0" * 16, "s2~" + "0" * 16
    # each round: a box and a None sealed for another session's job or another process,
    # refused; then a None that runs (from the second round on, the worker's short path
    # knows the stream: the refused ones meet it there)
    for round_ in range(3):
        job = f"j{round_}"
        for value in ([1], None):
            for other in (context(theirs, job), context(mine, job, "e" * 16)):
                box = driver.seal(value, "node:n0", other, safe=False)
                assert type(worker.open_exec(exec_of(mine, job), job, box)) is Failed
        ok = driver.seal(None, "node:n0", context(mine, job))
        assert worker.open_exec(exec_of(mine, job), job, ok) is None
