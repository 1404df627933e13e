"""The compact box's byte layout (``mpl.wire.sealed``, ``mpl.wire.seal_payload``): three
bytes of magic, and a small scalar's plaintext its msgpack bytes alone. Every byte of a box
is encrypted and authenticated again by CurveZMQ at both ends of every hop, so the layout
is pinned by size here; a box of the first format (eight bytes of magic, a scalar inside the
codec's record) is refused, by the general path and by a driver's short path alike."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from helpers import sealer_pair

from mpl.wire.errors import AuthenticationError
from mpl.wire.result_open import result_opener
from mpl.wire.seal import Sealer, done_context
from mpl.wire.seal_payload import FIXINT_FRAMES
from mpl.wire.sealed import BOX_MAGIC

_FIRST_MAGIC = b"mpl-box\x01"  # the first format's


def _epoch_cipher(sealer: Sealer, to: str) -> tuple[bytes, AESGCM]:
    """``sealer``'s epoch for ``to`` (drawn now if none) and its compact boxes' cipher, made
    as ``Sealer._epoch_keys`` makes it."""
    sealer.seal(0, to, "warm")
    epoch = sealer._sending[to][0][-16:]
    pair = sealer._pair_key(to, sealer.identity, to)
    key = hashlib.blake2b(epoch, key=pair, digest_size=32, person=b"mpl-box-epoch/1").digest()
    return epoch, AESGCM(key)


def test_a_small_scalar_is_sealed_as_its_msgpack_bytes_behind_three_bytes_of_magic() -> None:
    driver, node = sealer_pair()
    context = done_context("s", "j", 0)
    box = node.seal(7, "driver:a", context)
    assert type(box) is bytes and box.startswith(BOX_MAGIC) and len(BOX_MAGIC) == 3
    head = len(BOX_MAGIC) + 1 + len(b"node:n0") + 16
    assert len(box) == head + 12 + 1 + 16  # nonce, one byte of plaintext, tag
    _, aead = _epoch_cipher(node, "driver:a")
    assert aead.decrypt(box[head : head + 12], box[head + 12 :], context.encode() + b"|0/1|") == (
        b"\x07"
    )
    nothing = driver.seal(None, "node:n0", "exec|s|j")  # a sealed None: its tag alone
    head_a = len(BOX_MAGIC) + 1 + len(b"driver:a") + 16
    assert type(nothing) is bytes and len(nothing) == head_a + 12 + 16  # nonce and tag
    for value in (True, -1, 1 << 40, 0.25, "é€"):  # each in fewer bytes than the record
        sealed = node.seal(value, "driver:a", context)
        assert type(sealed) is bytes and len(sealed) < head + 12 + len(FIXINT_FRAMES[0][1]) + 16
        assert driver.open(sealed, context, sender="node:n0") == ("node:n0", value)


def _first_format(node: Sealer, value: int, context: str, magic: bytes) -> bytes:
    """A box of ``value`` as the first format held it (its scalar inside the codec's record),
    under ``magic``, sealed with the node's real epoch key, nonce and associated data."""
    epoch, aead = _epoch_cipher(node, "driver:a")
    nonce = next(node._sending["driver:a"][3]).to_bytes(12, "big")
    head = magic + bytes([len(b"node:n0")]) + b"node:n0" + epoch
    plain = FIXINT_FRAMES[value][1]
    return head + nonce + aead.encrypt(nonce, plain, context.encode() + b"|0/1|")


def test_a_box_of_the_first_format_is_refused() -> None:
    driver, node = sealer_pair()
    first = done_context("s", "j1", 0)
    with pytest.raises(AuthenticationError, match="malformed"):  # its epoch new here
        driver.open(_first_format(node, 7, first, _FIRST_MAGIC), first, sender="node:n0")
    good = node.seal(7, "driver:a", first)
    opener = result_opener(driver, {0: "node:n0"}, "s", True, str)
    assert opener("j1", {0: {0: good}}) == {0: {0: 7}}  # the epoch known: the short path
    later = done_context("s", "j2", 0)
    with pytest.raises(AuthenticationError, match="malformed"):
        opener("j2", {0: {0: _first_format(node, 7, later, _FIRST_MAGIC)}})
    # the codec's record under the new magic still opens (what a non-scalar is sealed as)
    record = _first_format(node, 7, later, BOX_MAGIC)
    assert opener("j2", {0: {0: record}}) == {0: {0: 7}}
