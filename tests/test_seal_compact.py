"""Compact boxes (``mpl.wire.seal``): small payloads sealed into one ``bytes`` string under a
per-process epoch key and a counter nonce. They must stay exactly as bound as ``Sealed``
records: a box replayed into another job, to another recipient, or under another sender's
name is refused, and no (key, nonce) pair is ever used twice."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from helpers import compact_box, decoded_as

from mpl.driver.sealing import DriverSeal
from mpl.wire import encode
from mpl.wire.done_pack import own_done_frames
from mpl.wire.errors import AuthenticationError, ProtocolError
from mpl.wire.exec_pack import _pack_bindings, exec_frames
from mpl.wire.jobs import Done, Exec, Failed, JobResult
from mpl.wire.replay import stamp
from mpl.wire.result_open import result_opener
from mpl.wire.seal import Sealer, done_context, exec_context
from mpl.wire.seal_payload import FIXINT_FRAMES
from mpl.wire.sealed import BOX_MAGIC, is_sealed
from mpl.wire.sessions import Reply
from mpl.worker.sealing import WorkerSeal

_HEAD = len(BOX_MAGIC) + 1  # then the sender's name, the 16-byte epoch, the 12-byte nonce


def _keys() -> tuple[str, str]:
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


class Parties:
    """Two drivers and two nodes that all list each other; a box between any two of them
    opens only for exactly that pair, direction and context."""

    def __init__(self) -> None:
        self.keys = {n: _keys() for n in ("driver:a", "driver:b", "node:n0", "node:n1")}
        drivers = {n: k[0] for n, k in self.keys.items() if n.startswith("driver:")}
        nodes = {n: k[0] for n, k in self.keys.items() if n.startswith("node:")}
        self.a, self.b = (self.sealer(n, nodes) for n in ("driver:a", "driver:b"))
        self.n0, self.n1 = (self.sealer(n, drivers) for n in ("node:n0", "node:n1"))

    def sealer(self, name: str, peers: dict[str, str]) -> Sealer:
        return Sealer(self.keys[name][1], name, peers)


@pytest.fixture
def parties() -> Parties:
    return Parties()


def _sender_end(box: bytes) -> int:
    return _HEAD + box[_HEAD - 1]


def _renamed(box: bytes, sender: str) -> bytes:
    name = sender.encode()
    return BOX_MAGIC + bytes([len(name)]) + name + box[_sender_end(box) :]


@pytest.mark.parametrize("pad", [0, 5000], ids=["in-header", "own-frame"])
def test_a_small_value_is_one_box_the_broker_routes_as_plain_bytes(
    parties: Parties, pad: int
) -> None:
    """Short boxes ride in the message header; longer ones (still no codec buffers inside)
    get a frame of their own on the way and arrive as bytes all the same."""
    value = {"x": 1, "marker": "VALUE-MARKER-5e1d", "pad": "p" * pad}
    box = parties.n0.seal(value, "driver:a", "done|s|j|0")
    assert type(box) is bytes and is_sealed(box)
    assert b"VALUE-MARKER-5e1d" not in box
    routed = decoded_as(Reply, encode(Reply(1, box)), unpickle=False).value  # the broker's view
    arrived = decoded_as(Reply, encode(Reply(1, routed))).value
    assert arrived == box
    assert parties.a.open(arrived, "done|s|j|0", sender="node:n0") == ("node:n0", value)


def test_an_exec_with_boxes_takes_the_drivers_packed_path(parties: Parties) -> None:
    """The driver packs an Exec of compact boxes without the general encoder, byte for byte
    what the encoder writes."""
    context = exec_context("s", "j1", "d", (0, 1), (0,), 5.0)
    boxes = {r: parties.a.seal(None, f"node:n{r}", context, safe=False) for r in (0, 1)}
    msg = Exec("s", "j1", "d", (0, 1), boxes, (0,), 5.0)
    assert _pack_bindings(msg.bindings) is not None
    assert exec_frames(msg) == encode(msg)


def test_a_sealed_done_takes_the_workers_packed_path(parties: Parties) -> None:
    """The worker packs its Done of compact boxes without the general encoder (as a
    plaintext one), byte for byte what the encoder writes."""
    rank0 = WorkerSeal(parties.n0, 0)
    context = exec_context("s", "j1", "d", (0,), (0,), 5.0)
    opened, _ = rank0.inbound(
        Exec("s", "j1", "d", (0,), {0: parties.a.seal(None, "node:n0", context)}, (0,), 5.0)
    )
    assert isinstance(opened, Exec) and opened.bindings == {}
    done = rank0.outbound(Done("s", "j1", 0, {0: 7, 1: "x"}, {"run_s": 0.1}, {0: "int"}, []))
    assert type(done) is Done and all(map(is_sealed, done.values.values()))
    assert own_done_frames(done) == encode(done)
    assert parties.a.open(done.values[0], "done|s|j1|0", sender="node:n0")[1] == 7


def test_a_box_replayed_into_another_job_recipient_or_sender_is_refused(
    parties: Parties,
) -> None:
    a, b, n0, n1 = parties.a, parties.b, parties.n0, parties.n1
    context = exec_context("s", "job1", "d", (0, 1), (0,), 5.0)
    box = a.seal([1, 2], "node:n0", context, safe=False)
    assert type(box) is bytes
    assert n0.open(box, context, safe=False) == ("driver:a", [1, 2])
    other_job = exec_context("s", "job2", "d", (0, 1), (0,), 5.0)
    with pytest.raises(AuthenticationError, match="replayed"):
        n0.open(box, other_job, safe=False)
    with pytest.raises(AuthenticationError, match="failed authentication"):
        n1.open(box, context, safe=False)  # sealed for node n0, handed to n1
    with pytest.raises(AuthenticationError, match="failed authentication"):
        n0.open(_renamed(box, "driver:b"), context, safe=False)  # under another driver's name
    with pytest.raises(AuthenticationError, match="claims to be sealed by"):
        n0.open(box, context, sender="driver:b", safe=False)
    # None (the box of a rank without inputs, opened without a decode) is bound alike
    nothing = a.seal(None, "node:n0", context, safe=False)
    assert n0.open(nothing, context) == ("driver:a", None)
    with pytest.raises(AuthenticationError, match="replayed"):
        n0.open(nothing, other_job)
    with pytest.raises(AuthenticationError, match="failed authentication"):
        n1.open(nothing, context)
    # a result sent back the other way is bound to its direction as well
    result = n0.seal(7, "driver:a", "done|s|job1|0")
    assert a.open(result, "done|s|job1|0", sender="node:n0")[1] == 7
    with pytest.raises(AuthenticationError):
        b.open(result, "done|s|job1|0", sender="node:n0")
    with pytest.raises(AuthenticationError):
        a.open(result, "done|s|job1|1", sender="node:n0")  # another output slot


def test_a_box_for_one_rank_does_not_run_a_job_on_another(parties: Parties) -> None:
    context = exec_context("s", "j1", "d", (0, 1), (), 5.0)
    mine = parties.a.seal(None, "node:n0", context, safe=False)
    rank1 = WorkerSeal(parties.n1, 1)
    opened, answer = rank1.inbound(Exec("s", "j1", "d", (0, 1), {1: mine}, (), 5.0))
    assert opened is None and isinstance(answer, Failed)
    assert answer.error.kind == "AuthenticationError"
    assert rank1.refusals == 1


@pytest.mark.parametrize("where", ["magic", "epoch", "nonce", "ciphertext", "tag", "short"])
def test_any_alteration_of_a_box_fails_authentication(parties: Parties, where: str) -> None:
    box = bytearray(compact_box(parties.a.seal([3], "node:n0", "ctx", safe=False)))
    end = _sender_end(bytes(box))
    if where == "magic":
        box[0] ^= 1
    elif where == "epoch":
        box[end] ^= 1
    elif where == "nonce":
        box[end + 16 + 11] ^= 1
    elif where == "ciphertext":
        box[end + 28] ^= 0x80
    elif where == "tag":
        box[-1] ^= 1
    else:
        del box[end + 30 :]
    with pytest.raises(AuthenticationError):
        parties.n0.open(bytes(box), "ctx", safe=False)


def test_no_nonce_is_used_twice_and_a_restarted_sealer_takes_a_new_epoch(
    parties: Parties,
) -> None:
    a = parties.a
    boxes = [compact_box(a.seal(i, "node:n0", "ctx")) for i in range(500)]
    end = _sender_end(boxes[0])
    epochs = {bytes(b)[end : end + 16] for b in boxes}
    nonces = {bytes(b)[end + 16 : end + 28] for b in boxes}
    assert len(epochs) == 1 and len(nonces) == 500
    again = parties.sealer("driver:a", {"node:n0": parties.keys["node:n0"][0]})
    restarted = bytes(compact_box(again.seal(0, "node:n0", "ctx")))
    assert restarted[end : end + 16] not in epochs
    assert parties.n0.open(restarted, "ctx")[1] == 0  # and still opens


def test_a_known_epoch_opens_nothing_it_would_not_have_opened_before(parties: Parties) -> None:
    """Once a box of an epoch has opened, its head (sender, epoch) finds the sender and the
    cipher without the spec lookup: the sender a result must come from is still checked,
    a head moved onto another party's box still meets this epoch's key, and a known box is
    still bound to its context."""
    n0 = parties.n0
    from_a, from_b = (compact_box(p.seal(1, "node:n0", "ctx")) for p in (parties.a, parties.b))
    assert n0.open(from_a, "ctx", sender="driver:a")[1] == 1
    assert n0.open(from_b, "ctx", sender="driver:b")[1] == 1
    again = parties.a.seal(2, "node:n0", "ctx")  # the same head as from_a: a cache hit
    with pytest.raises(AuthenticationError, match="claims to be sealed by driver:a"):
        n0.open(again, "ctx", sender="driver:b")
    end_a, end_b = _sender_end(from_a) + 16, _sender_end(from_b) + 16
    b_as_a = from_a[:end_a] + compact_box(parties.b.seal(3, "node:n0", "ctx"))[end_b:]
    with pytest.raises(AuthenticationError, match="failed authentication"):
        n0.open(b_as_a, "ctx")
    with pytest.raises(AuthenticationError, match="failed authentication"):
        n0.open(again, "ctx2")
    assert n0.open(again, "ctx", sender="driver:a")[1] == 2


def test_forged_epochs_cannot_grow_or_flush_what_a_recipient_keeps(parties: Parties) -> None:
    n0 = parties.n0
    good = compact_box(parties.a.seal(1, "node:n0", "ctx"))
    assert n0.open(good, "ctx")[1] == 1
    kept = dict(n0._receiving)
    assert len(kept) == 1
    end = _sender_end(good)
    for i in range(50):
        forged = good[:end] + i.to_bytes(16, "big") + good[end + 16 :]
        with pytest.raises(AuthenticationError):
            n0.open(forged, "ctx")
    assert dict(n0._receiving) == kept


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -1, 127, -33, 1 << 63, (1 << 64) - 1, -(1 << 63), 0.5, 1.0, "", "é€x"],
)
def test_small_scalars_come_back_with_their_type(parties: Parties, value: object) -> None:
    box = parties.n0.seal(value, "driver:a", "done|s|j|0")
    opened = parties.a.open(box, "done|s|j|0", sender="node:n0")[1]
    assert opened == value and type(opened) is type(value)


@pytest.mark.parametrize("form", ["raw", "codec"])
@pytest.mark.parametrize(
    "plaintext",
    [b"\xa2\xff\xfe", b"\x01\x02", b"\xcd\x01", b"\x91\x01"],
    ids=["bad-utf8", "extra-bytes", "truncated", "a-list"],
)
def test_odd_plaintext_from_a_listed_party_goes_through_the_codecs_checks(
    parties: Parties, plaintext: bytes, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listed (but hostile) party may seal any plaintext: a raw scalar (a compact box's
    small scalar, its msgpack bytes alone) reads only as exactly one scalar, and inside the
    codec's record the scalar shortcut reads only what the codec would read the same way,
    leaving the rest to the codec's checks."""
    from mpl.wire import seal as seal_module
    from mpl.wire import seal_payload

    crafted = plaintext if form == "raw" else seal_payload._PAYLOAD_HEAD + plaintext
    monkeypatch.setattr(seal_module, "raw_scalar", lambda value: crafted)
    box = parties.n0.seal(1000, "driver:a", "ctx")  # no fixint: sealed via raw_scalar
    monkeypatch.undo()
    if plaintext == b"\x91\x01" and form == "codec":
        assert parties.a.open(box, "ctx")[1] == [1]  # not a scalar: the codec decodes it
        return
    with pytest.raises(ProtocolError):  # a raw list: no raw scalar, and no codec header
        parties.a.open(box, "ctx")


def test_what_a_recipient_keeps_of_epochs_is_bounded(
    parties: Parties, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each restarted sender brings a new epoch: the recipient keeps a bounded number of
    them, and a box of an epoch it let go still opens (its key is made again)."""
    from mpl.wire import seal as seal_module

    monkeypatch.setattr(seal_module, "_EPOCHS_KEPT", 3)
    nodes = {"node:n0": parties.keys["node:n0"][0]}
    boxes = [parties.sealer("driver:a", nodes).seal(i, "node:n0", "ctx") for i in range(6)]
    for i, box in enumerate(boxes):
        assert parties.n0.open(box, "ctx")[1] == i
        assert len(parties.n0._receiving) <= 3
    assert parties.n0.open(boxes[0], "ctx")[1] == 0


class _ChangedMeanwhile(dict):  # type: ignore[type-arg]
    """The kept epochs as another thread would leave them mid-eviction: iterating fails."""

    def __iter__(self) -> Any:
        raise RuntimeError("dictionary changed size during iteration")


def test_an_eviction_that_races_another_thread_still_opens_the_box(
    parties: Parties, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several threads open boxes with one Sealer (the worker's I/O, peer and job threads):
    when the kept epochs change under an eviction, the box still opens and the table stays
    bounded by what the next eviction takes."""
    from mpl.wire import seal as seal_module

    monkeypatch.setattr(seal_module, "_EPOCHS_KEPT", 1)
    nodes = {"node:n0": parties.keys["node:n0"][0]}
    first, second = (parties.sealer("driver:a", nodes).seal(i, "node:n0", "ctx") for i in (1, 2))
    assert parties.n0.open(first, "ctx")[1] == 1
    parties.n0._receiving = _ChangedMeanwhile(parties.n0._receiving)
    assert parties.n0.open(second, "ctx")[1] == 2
    assert len(parties.n0._receiving) == 2  # the eviction was skipped, not the box


_FORK_CHECK = """
import os, sys, warnings
warnings.simplefilter("ignore")  # JAX, if loaded, warns that fork and threads do not mix
import zmq
from mpl.wire.seal import Sealer
from mpl.wire.sealed import BOX_MAGIC
keys = {n: zmq.curve_keypair() for n in ("driver:a", "node:n0")}
public = {n: k[0].decode() for n, k in keys.items()}
driver = Sealer(keys["driver:a"][1].decode(), "driver:a", {"node:n0": public["node:n0"]})
start = len(BOX_MAGIC) + 1 + len("driver:a")
driver.seal(1, "node:n0", "ctx")  # the parent has an epoch and a counter for node:n0
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child seals its next box, then leaves at once
    os.write(write, driver.seal(2, "node:n0", "ctx")[start : start + 28])
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
with os.fdopen(read, "rb") as f:
    child = f.read()
parent = driver.seal(2, "node:n0", "ctx")[start : start + 28]
sys.exit(0 if len(child) == 28 and child[:16] != parent[:16] else 1)
"""


def test_a_forked_process_never_reuses_its_parents_epoch() -> None:
    # The same epoch key and counter in two processes would seal two boxes under one
    # (key, nonce) pair, which gives away both plaintexts' XOR and the Poly1305 key.
    # Forked in a fresh interpreter: JAX's threads here make pytest fail on its warning.
    done = subprocess.run([sys.executable, "-c", _FORK_CHECK], timeout=60, check=False)
    assert done.returncode == 0


def test_the_driver_refuses_one_ranks_result_box_handed_on_as_anothers(parties: Parties) -> None:
    """Both ranks seal output 0 of a job for the same driver under the same context: only the
    sender check in DriverSeal.result (the rank's node, from the session's layout) stops a
    broker from passing rank 0's value off as rank 1's."""
    spec = SimpleNamespace(nodes=[SimpleNamespace(name="n0"), SimpleNamespace(name="n1")])
    driver = DriverSeal(parties.a, SimpleNamespace(cluster=spec), trusted=False)  # type: ignore[arg-type]
    layout = SimpleNamespace(nodes=[SimpleNamespace(name=f"n{r}", rank=r) for r in (0, 1)])
    driver.bind(layout)  # type: ignore[arg-type]
    context = done_context("s", "job1", 0)
    from_n0 = parties.n0.seal(7, "driver:a", context)
    from_n1 = parties.n1.seal(8, "driver:a", context)
    honest = driver.result("s", JobResult("job1", {0: {0: from_n0, 1: from_n1}}))
    assert honest.values == {0: {0: 7, 1: 8}}
    with pytest.raises(AuthenticationError, match="claims to be sealed by node:n0"):
        driver.result("s", JobResult("job1", {0: {0: from_n0, 1: from_n0}}))


def test_a_results_values_opened_in_one_call_as_open_opens_each(parties: Parties) -> None:
    """result_opener (a result's inline values, every output and rank in one call): what
    opens is what open() gives value by value, boxes of epochs known or not, records and
    Nones alike; a box from another node than its rank's, for another output or job, or
    altered, is refused; a rank with no sender is the caller's to name."""
    a, n0, n1 = parties.a, parties.n0, parties.n1
    senders = {0: "node:n0", 1: "node:n1"}

    def unknown(rank: int) -> str:
        raise LookupError(rank)

    opened = result_opener(a, senders, "s", True, unknown)
    context = done_context("s", "j1", 0)
    first = {0: n0.seal(7, "driver:a", context), 1: n1.seal(None, "driver:a", context)}
    assert opened("j1", {0: first}) == {0: {0: 7, 1: None}}  # epochs learnt
    values: dict[int, Any] = {0: "text", 1: b"x" * (1 << 17)}  # a short str; a record
    sealed = {r: s.seal(values[r], "driver:a", context) for r, s in ((0, n0), (1, n1))}
    assert type(sealed[0]) is bytes and type(sealed[1]) is not bytes
    assert opened("j1", {0: sealed}) == {0: values}
    two = {i: {0: n0.seal(i, "driver:a", done_context("s", "j2", i))} for i in (0, 1, 17)}
    assert opened("j2", two) == {0: {0: 0}, 1: {0: 1}, 17: {0: 17}}
    box = n0.seal(8, "driver:a", context)
    assert isinstance(box, bytes)  # an int is sealed compact
    mixed = {0: box, 1: box}  # rank 1 answered with node n0's box: the epoch is n0's
    for job, sent in (("j1", {1: mixed}), ("j2", {0: {0: box}}), ("j1", {0: mixed})):
        with pytest.raises(AuthenticationError):  # another output, job, or node
            opened(job, sent)
    for other in (result_opener(a, senders, "t", True, unknown),):  # another session
        with pytest.raises(AuthenticationError):
            other("j1", {0: {0: box}})
    altered = box[:-1] + bytes([box[-1] ^ 1])
    with pytest.raises(AuthenticationError, match="failed authentication"):
        opened("j1", {0: {0: altered}})
    with pytest.raises(LookupError):  # a rank with no sender: the caller says why
        opened("j1", {0: {2: box}})
    assert opened("j1", {0: {0: box}}) == {0: {0: 8}}
    senders[0] = "node:n1"  # rank 0 now another node's: the epoch it knew is not its
    with pytest.raises(AuthenticationError, match="claims to be sealed by node:n0"):
        opened("j1", {0: {0: box}})


def test_renew_starts_a_new_epoch_once_the_current_has_numbered_enough(
    parties: Parties,
) -> None:
    """``Sealer.renew(to, numbered)``: a new epoch (numbers from 0 again) only once the
    current one has numbered at least ``numbered`` payloads; its numbers never go back."""
    driver = parties.a
    context = exec_context("s", "j1", "d", (0,), (0,), 5.0)
    numbers = [stamp(driver.seal(None, "node:n0", context))[1] for _ in range(3)]
    assert numbers == [0, 1, 2]
    assert not driver.renew("node:n0", 10)  # 3 numbered (4 with the one it draws)
    later = stamp(driver.seal(None, "node:n0", context))
    assert later[1] > numbers[-1]  # the same epoch, numbers still going up
    assert driver.renew("node:n0", 4)  # 4 numbered (its epoch's 0 to 3)
    fresh = stamp(driver.seal(None, "node:n0", context))
    assert fresh[1] == 0 and fresh[0] != later[0]  # a new epoch
    assert not driver.renew("node:n1", 0)  # no epoch for it yet: nothing to renew


@pytest.mark.parametrize(
    "values",
    [
        {0: 1},
        {0: None, 1: True, 2: -(1 << 63), 3: 0.5, 4: "text", 5: 127, 6: -32},
        {0: 2, 15: 3, 16: 4, 40: None},  # past the outputs whose associated data is kept
    ],
)
def test_a_dones_scalars_sealed_in_one_call_are_bound_as_seal_binds_them(
    parties: Parties, values: dict[int, Any]
) -> None:
    """Sealer.seal_scalars (an inline Done's small values, sealed in one call): each box
    opens as seal()'s would, for the driver it was sealed for, from the node that sealed
    it, for its own job and output only; moved by a hostile broker to another output, job,
    rank or driver, it is refused."""
    a, b, n0 = parties.a, parties.b, parties.n0
    boxes = n0.seal_scalars(values, "driver:a", "done|s|j1|")
    assert boxes is not None and boxes.keys() == values.keys()
    assert all(type(box) is bytes and box.startswith(BOX_MAGIC) for box in boxes.values())
    senders = {0: "node:n0", 1: "node:n1"}
    for index, value in values.items():
        opened = a.open(boxes[index], done_context("s", "j1", index), sender="node:n0")
        assert opened == ("node:n0", value) and type(opened[1]) is type(value)
    opened = result_opener(a, senders, "s", True, str)
    assert opened("j1", {0: {0: boxes[0]}}) == {0: {0: values[0]}}
    moved = [
        (a, "j1", {9: {0: boxes[0]}}),  # to another output
        (a, "j2", {0: {0: boxes[0]}}),  # into another job
        (a, "j1", {0: {1: boxes[0]}}),  # passed off as rank 1's
        (b, "j1", {0: {0: boxes[0]}}),  # to another driver
    ]
    for driver, job, sealed in moved:
        with pytest.raises(AuthenticationError):
            result_opener(driver, senders, "s", True, str)(job, sealed)


def test_a_done_with_values_other_than_small_scalars_is_left_to_seal(parties: Parties) -> None:
    """A Done holding anything but small scalars is not sealed by seal_scalars (None: the
    worker's seal takes the Done and seals each value as it needs, or says why not)."""
    n0 = parties.n0
    assert n0.seal_scalars({0: 1, 1: [1, 2]}, "driver:a", "done|s|j|") is None
    assert n0.seal_scalars({0: b"x" * 10}, "driver:a", "done|s|j|") is None
    assert n0.seal_scalars({0: "x" * 100}, "driver:a", "done|s|j|") is None
    worker = WorkerSeal(n0, 0)
    assert worker.sealed_scalars("s", "j", {0: 1}) is None  # no driver opened job j here


def _chacha_box(sealer: Sealer, to: str, value: int, context: str) -> bytes:
    """A compact box of ``value`` as ``sealer`` sealed them before they were AES-GCM: the
    same head, epoch key, nonce and associated data, under ChaCha20-Poly1305."""
    sealer.seal(0, to, context)  # its epoch for ``to`` drawn
    head, _, _, counter = sealer._sending[to]
    epoch = head[-16:]
    pair = sealer._pair_key(to, sealer.identity, to)
    key = hashlib.blake2b(epoch, key=pair, digest_size=32, person=b"mpl-box-epoch/1").digest()
    nonce = next(counter).to_bytes(12, "big")
    plain = FIXINT_FRAMES[value][1]
    aad = context.encode() + b"|0/1|"  # the context, then a one-piece layout without buffers
    return head + nonce + ChaCha20Poly1305(key).encrypt(nonce, plain, aad)


def test_a_compact_box_is_aes_gcm_and_one_under_chacha20_poly1305_is_refused(
    parties: Parties,
) -> None:
    """Compact boxes are AES-256-GCM under their epoch's key (cheaper per small box than
    ChaCha20-Poly1305, which f9464a8 sealed them with): a box of the old form, everything
    else as it was, does not open, whether its epoch is new to the recipient or known (a
    worker's answer on the driver's short path, a driver's bindings at the worker)."""
    a, n0 = parties.a, parties.n0
    context = done_context("s", "j1", 0)
    with pytest.raises(AuthenticationError):  # its epoch new to the driver
        a.open(_chacha_box(n0, "driver:a", 7, context), context, sender="node:n0")
    good = n0.seal(7, "driver:a", context)
    assert type(good) is bytes and a.open(good, context, sender="node:n0") == ("node:n0", 7)
    opener = result_opener(a, {0: "node:n0"}, "s", True, str)
    assert opener("j1", {0: {0: good}}) == {0: {0: 7}}  # the epoch known: the short path
    old = _chacha_box(n0, "driver:a", 7, done_context("s", "j2", 0))
    with pytest.raises(AuthenticationError):
        opener("j2", {0: {0: old}})
    with pytest.raises(AuthenticationError):
        a.open(old, done_context("s", "j2", 0), sender="node:n0")
    bindings = exec_context("s", "j3", "d", (0,), (0,), 5.0)  # a driver's box, at the worker
    with pytest.raises(AuthenticationError):
        n0.open(_chacha_box(a, "node:n0", 3, bindings), bindings, sender="driver:a")
    assert n0.open(a.seal(3, "node:n0", bindings), bindings) == ("driver:a", 3)
