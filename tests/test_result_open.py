"""The driver's opener of a job's sealed values (``mpl.wire.result_open``), which opens a
known epoch's box itself (``box_open`` written out): every value opens as ``Sealer.open``
opens it, and every altered, cut, extended or replayed box is refused as it refuses it."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from helpers import sealer_pair

from mpl.wire.errors import AuthenticationError
from mpl.wire.result_open import result_opener
from mpl.wire.seal import _COMPACT_AAD, _box_nonce, done_context
from mpl.wire.seal_box import ETM_MAX, box_seal
from mpl.wire.seal_payload import RAW_FIXINT

VALUES: list[Any] = [
    7,  # one byte of plaintext: its value from a table
    None,
    True,
    False,
    -5,
    -32,  # the fixints' ends
    127,
    "",  # one byte of plaintext the table does not hold: read by the codec
    1000,  # a few bytes
    2.5,
    "short text",
    "y" * (ETM_MAX - 8),  # near the largest BLAKE2b box
    "z" * (ETM_MAX + 40),  # AES-256-GCM
]


def _unknown(rank: int) -> str:
    raise AuthenticationError(f"rank {rank} has no node here")


def _setup() -> tuple[Any, Any, Any]:
    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)

    def box(job: str, value: Any, index: int = 0) -> Any:
        return node.seal(value, "driver:a", done_context("s", job, index))

    assert opener("j0", {0: {0: box("j0", 1)}}) == {0: {0: 1}}  # its epoch learnt: known
    return driver, opener, box


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_a_known_epochs_box_opens_as_sealer_open_opens_it(value: Any) -> None:
    driver, opener, box = _setup()
    for i, index in enumerate((0, 3, 20)):  # a common output index and an uncommon one
        job = f"j{i + 1}"
        sealed = box(job, value, index)
        expected = driver.open(sealed, done_context("s", job, index), sender="node:n0")[1]
        assert expected == value
        assert opener(job, {index: {0: sealed}}) == {index: {0: value}}


@pytest.mark.parametrize("value", [7, "", 1000, "short text", "z" * (ETM_MAX + 40)])
def test_every_altered_cut_extended_or_replayed_box_is_refused(value: Any) -> None:
    driver, opener, box = _setup()
    sealed = box("j1", value)
    context = done_context("s", "j1", 0)
    forged = [
        *(sealed[:at] + bytes([sealed[at] ^ 1]) + sealed[at + 1 :] for at in range(len(sealed))),
        sealed[:-1],
        sealed + b"\x00",
        sealed[:-17],
    ]
    for bad in forged:
        with pytest.raises(AuthenticationError):
            driver.open(bad, context, sender="node:n0")
        with pytest.raises(AuthenticationError):
            opener("j1", {0: {0: bad}})
    with pytest.raises(AuthenticationError):  # another job's, or another output's
        opener("j2", {0: {0: sealed}})
    with pytest.raises(AuthenticationError):
        opener("j1", {1: {0: sealed}})
    assert opener("j1", {0: {0: sealed}}) == {0: {0: value}}  # the genuine one still opens


# Review w31-rev-perf: the opener's one-byte short path (63c01d3) and seal_scalars' small
# int written out (25b3456), told apart from the general paths byte by byte and outcome by
# outcome: every one-byte plaintext, and boxes altered at random in many places at once.


def _outcome(open_it: Callable[[], Any]) -> tuple[str, Any]:
    """What opening gave: its value and type, or the error's type and message."""
    try:
        value = open_it()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "opened", (type(value), value)


def _raw_box(node: Any, plain: bytes, job: str, index: int = 0) -> bytes:
    """A box of ``plain`` (any bytes, not only what seal() makes of a value) as the node's
    epoch for the driver seals one: seal()'s steps with the plaintext given."""
    head, keys, _, counter = node._sending["driver:a"]
    nonce = _box_nonce(next(counter))
    aad = done_context("s", job, index).encode() + _COMPACT_AAD
    return bytes(b"".join((head, nonce, box_seal(keys, nonce, plain, aad))))


def _same(driver: Any, opener: Any, box: Any, job: str, index: int = 0) -> tuple[str, Any]:
    context = done_context("s", job, index)
    general = _outcome(lambda: driver.open(box, context, sender="node:n0")[1])
    short = _outcome(lambda: opener(job, {index: {0: box}})[index][0])
    assert short == general, (box, short, general)
    return general


def test_every_one_byte_plaintext_opens_on_the_short_path_as_sealer_open_opens_it() -> None:
    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)
    assert opener("j0", {0: {0: node.seal(1, "driver:a", done_context("s", "j0", 0))}})
    opened = 0
    for byte in range(256):
        for index in (0, 20):  # a common output index and an uncommon one
            job = f"j{byte}-{index}"
            kind, _ = _same(driver, opener, _raw_box(node, bytes([byte]), job, index), job, index)
            opened += kind == "opened"
    assert opened >= 2 * (32 + 128 + 3)  # the fixints, None and the bools at least


def test_boxes_altered_at_random_are_refused_on_the_short_path_as_sealer_open_refuses_them() -> (
    None
):
    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)
    assert opener("j0", {0: {0: node.seal(1, "driver:a", done_context("s", "j0", 0))}})
    rng = random.Random(31)
    plains = [bytes([b]) for b in range(256)] + [RAW_FIXINT[5] * 2, b"\xa1x"]
    refused = 0
    for n in range(3000):
        job = f"j{n}"
        good = _raw_box(node, rng.choice(plains), job)
        other = _raw_box(node, rng.choice(plains), job)  # same job, its own nonce
        bad = bytearray(good)
        how = rng.randrange(5)
        if how == 0:  # a few bytes anywhere changed
            for _ in range(rng.randrange(1, 4)):
                bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        elif how == 1:  # cut or extended by a few bytes
            cut = rng.randrange(1, 4)
            bad = (
                bad[:-cut]
                if rng.random() < 0.5
                else bad + bytes(rng.randrange(256) for _ in range(cut))
            )
        elif how == 2:  # another box's ciphertext under this one's nonce and tag
            at = len(good) - 17
            bad[at] = other[at]
        elif how == 3:  # another box's tag
            bad[-16:] = other[-16:]
        else:  # the head and nonce of one, the rest of another
            bad[-17:] = other[-17:]
        kind, _ = _same(driver, opener, bytes(bad), job)
        refused += kind == "AuthenticationError"
        assert _same(driver, opener, good, job)[0] != "AuthenticationError"
    assert refused >= 2500  # (a ciphertext or tag swapped for its own equal stays genuine)


@pytest.mark.parametrize("index", [0, 5, 15, 16, 40])
def test_seal_scalars_seals_each_small_int_in_the_bytes_box_seal_makes(index: int) -> None:
    """seal_scalars' small int box (box_seal written out) is byte for byte the box of its
    msgpack bytes under the same nonce, as box_seal makes it, for every fixint."""
    _, node = sealer_pair()
    for value in range(-32, 128):
        boxes = node.seal_scalars({index: value}, "driver:a", "done|s|j|")
        assert boxes is not None
        box = boxes[index]
        head, keys, _, _ = node._sending["driver:a"]
        nonce = box[len(head) : len(head) + 12]
        aad = done_context("s", "j", index).encode() + _COMPACT_AAD
        assert box == b"".join((head, nonce, box_seal(keys, nonce, RAW_FIXINT[value], aad)))
