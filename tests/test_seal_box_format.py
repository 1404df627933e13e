"""The compact box's byte layout and cipher (``mpl.wire.sealed``, ``mpl.wire.seal``,
``mpl.wire.seal_payload``): three bytes of magic, a small scalar's plaintext its msgpack
bytes alone, sealed by prefix-keyed BLAKE2b (encrypt-then-MAC) up to 64 bytes of plaintext
and by AES-256-GCM above, a one-byte plaintext's pad a byte of a run of 64 nonces' pads, the
format's version authenticated. Every byte of a box is encrypted and authenticated again by
CurveZMQ at both ends of every hop, so the layout is pinned by size here, and the cipher by
bytes computed here from the epoch's keys (not by the sealer's own code). Boxes of earlier
formats are refused: the first (eight bytes of magic, a scalar inside the codec's record),
the second (every box under AES-256-GCM, its magic not authenticated), the third (keyed
BLAKE2b) and the fourth (a pad hashed for every box), by the general path and by a
driver's and a worker's short paths alike, an earlier format named in the error."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from helpers import sealer_pair

from mpl.wire.errors import AuthenticationError
from mpl.wire.jobs import Exec, Failed
from mpl.wire.result_open import result_opener
from mpl.wire.seal import Sealer, done_context, exec_context
from mpl.wire.seal_payload import FIXINT_FRAMES
from mpl.wire.sealed import BOX_MAGIC
from mpl.worker.sealing import WorkerSeal

_FIRST_MAGIC = b"mpl-box\x01"  # the first format's
_SECOND_MAGIC = b"MB\x02"  # the second's: every box AES-256-GCM, its magic unauthenticated
_THIRD_MAGIC = b"MB\x03"  # the third's: keyed BLAKE2b (its key a whole block) up to 64 bytes
_FOURTH_MAGIC = b"MB\x04"  # the fourth's: prefix-keyed BLAKE2b, a pad hashed for every box


def _epoch(sealer: Sealer, to: str) -> tuple[bytes, bytes]:
    """``sealer``'s epoch for ``to`` (drawn now if none) and the direction's key."""
    sealer.seal(0, to, "warm")
    return sealer._sending[to][0][-16:], sealer._pair_key(to, sealer.identity, to)


def _key(pair: bytes, epoch: bytes, person: bytes) -> bytes:
    return hashlib.blake2b(epoch, key=pair, digest_size=32, person=person).digest()


def _prf(pair: bytes, epoch: bytes, person: bytes, data: bytes, size: int) -> bytes:
    """The fourth and fifth formats' PRF: unkeyed BLAKE2b (personalised ``person``) of the
    epoch's 32-byte key of ``person`` followed by ``data``."""
    key = _key(pair, epoch, person)
    return hashlib.blake2b(key + data, digest_size=size, person=person).digest()


def _fifth(sealer: Sealer, to: str, nonce: bytes, plain: bytes, aad: bytes) -> bytes:
    """Ciphertext and tag of ``plain`` as the fifth format (this one) seals it, written out
    here from the epoch's keys: up to 64 bytes, the plaintext XOR its pad, then BLAKE2b-128
    of the tag key ("mpl-box-mac/5") then the nonce, the length byte, the ciphertext and the
    associated data; above, AES-256-GCM (key "mpl-box-epoch/5"). The pad of one byte is
    byte ``n % 64`` of BLAKE2b-512 of the pad key ("mpl-box-pad/5") then ``n // 64`` in 13
    bytes (``n``: the nonce's number); of more, BLAKE2b-512 of the pad key then the nonce.
    The associated data ends with the magic."""
    epoch, pair = _epoch(sealer, to)
    aad += BOX_MAGIC
    if len(plain) > 64:
        return AESGCM(_key(pair, epoch, b"mpl-box-epoch/5")).encrypt(nonce, plain, aad)
    if len(plain) == 1:
        number = int.from_bytes(nonce, "big")
        run = _prf(pair, epoch, b"mpl-box-pad/5", (number // 64).to_bytes(13, "big"), 64)
        pad = run[number % 64 :]
    else:
        pad = _prf(pair, epoch, b"mpl-box-pad/5", nonce, 64)
    hidden = bytes(p ^ k for p, k in zip(plain, pad, strict=False))
    tag = _prf(pair, epoch, b"mpl-box-mac/5", nonce + bytes([len(plain)]) + hidden + aad, 16)
    return hidden + tag


def _fourth(sealer: Sealer, to: str, nonce: bytes, plain: bytes, aad: bytes) -> bytes:
    """Ciphertext and tag of ``plain`` (at most 64 bytes) as the fourth format sealed it:
    the plaintext XOR BLAKE2b-512 of the pad key ("mpl-box-pad/4") then the nonce (for every
    box), then BLAKE2b-128 of the tag key ("mpl-box-mac/4") then the nonce, the length byte,
    the ciphertext and the associated data (ending with the fourth format's magic)."""
    epoch, pair = _epoch(sealer, to)
    aad += _FOURTH_MAGIC
    pad = _prf(pair, epoch, b"mpl-box-pad/4", nonce, 64)
    hidden = bytes(p ^ k for p, k in zip(plain, pad, strict=False))
    tag = _prf(pair, epoch, b"mpl-box-mac/4", nonce + bytes([len(plain)]) + hidden + aad, 16)
    return hidden + tag


def _fourth_format(sealer: Sealer, to: str, plain: bytes, context: str, magic: bytes) -> bytes:
    """A box of ``plain`` as the fourth format sealed it, under ``magic``, with the sealer's
    real epoch and next nonce."""
    nonce = _next_nonce(sealer, to)
    aad = context.encode() + b"|0/1|"
    return _head(sealer, to, magic) + nonce + _fourth(sealer, to, nonce, plain, aad)


def _fourth_none(sealer: Sealer, to: str, context: str, magic: bytes) -> bytes:
    """A sealed None as the fourth format made it: BLAKE2b-128 of its key ("mpl-box-mark/4"),
    nonce and context."""
    epoch, pair = _epoch(sealer, to)
    nonce = _next_nonce(sealer, to)
    tag = _prf(pair, epoch, b"mpl-box-mark/4", nonce + context.encode(), 16)
    return _head(sealer, to, magic) + nonce + tag


def _third(sealer: Sealer, to: str, nonce: bytes, plain: bytes, aad: bytes) -> bytes:
    """Ciphertext and tag of ``plain`` (at most 64 bytes) as the third format sealed it:
    the plaintext XOR keyed BLAKE2b-512 of the nonce (key "mpl-box-pad/3"), then keyed
    BLAKE2b-128 (key "mpl-box-mac/3") of the nonce, the length byte, the ciphertext and the
    associated data (ending with the third format's magic)."""
    epoch, pair = _epoch(sealer, to)
    aad += _THIRD_MAGIC
    pad = hashlib.blake2b(nonce, key=_key(pair, epoch, b"mpl-box-pad/3")).digest()
    hidden = bytes(p ^ k for p, k in zip(plain, pad, strict=False))
    mac = hashlib.blake2b(key=_key(pair, epoch, b"mpl-box-mac/3"), digest_size=16)
    mac.update(nonce + bytes([len(plain)]) + hidden + aad)
    return hidden + mac.digest()


def _third_format(sealer: Sealer, to: str, plain: bytes, context: str, magic: bytes) -> bytes:
    """A box of ``plain`` as the third format sealed it, under ``magic``, with the sealer's
    real epoch and next nonce."""
    nonce = _next_nonce(sealer, to)
    aad = context.encode() + b"|0/1|"
    return _head(sealer, to, magic) + nonce + _third(sealer, to, nonce, plain, aad)


def _third_none(sealer: Sealer, to: str, context: str, magic: bytes) -> bytes:
    """A sealed None as the third format made it: keyed BLAKE2b-128 (key "mpl-box-mark/3")
    of its nonce and context."""
    epoch, pair = _epoch(sealer, to)
    nonce = _next_nonce(sealer, to)
    tag = hashlib.blake2b(key=_key(pair, epoch, b"mpl-box-mark/3"), digest_size=16)
    tag.update(nonce + context.encode())
    return _head(sealer, to, magic) + nonce + tag.digest()


def _next_nonce(sealer: Sealer, to: str) -> bytes:
    _epoch(sealer, to)  # (drawn now if none)
    return next(sealer._sending[to][3]).to_bytes(12, "big")


def _head(sealer: Sealer, to: str, magic: bytes) -> bytes:
    me = sealer.identity.encode()
    return magic + bytes([len(me)]) + me + _epoch(sealer, to)[0]


def _second_format(sealer: Sealer, to: str, plain: bytes, context: str, magic: bytes) -> bytes:
    """A box of ``plain`` as the second format sealed it (AES-256-GCM under the epoch key
    "mpl-box-epoch/1", associated data without the magic), under ``magic``, with the
    sealer's real epoch and next nonce."""
    epoch, pair = _epoch(sealer, to)
    nonce = _next_nonce(sealer, to)
    aead = AESGCM(_key(pair, epoch, b"mpl-box-epoch/1"))
    return (
        _head(sealer, to, magic) + nonce + aead.encrypt(nonce, plain, context.encode() + b"|0/1|")
    )


def _second_none(sealer: Sealer, to: str, context: str, magic: bytes) -> bytes:
    """A sealed None as the second format made it: its tag under the key "mpl-box-mark/1"."""
    epoch, pair = _epoch(sealer, to)
    nonce = _next_nonce(sealer, to)
    tag = hashlib.blake2b(key=_key(pair, epoch, b"mpl-box-mark/1"), digest_size=16)
    tag.update(nonce + context.encode())
    return _head(sealer, to, magic) + nonce + tag.digest()


def test_a_small_scalar_is_sealed_as_its_msgpack_bytes_behind_three_bytes_of_magic() -> None:
    driver, node = sealer_pair()
    context = done_context("s", "j", 0)
    box = node.seal(7, "driver:a", context)
    assert type(box) is bytes and box.startswith(BOX_MAGIC) and len(BOX_MAGIC) == 3
    head = len(BOX_MAGIC) + 1 + len(b"node:n0") + 16
    assert len(box) == head + 12 + 1 + 16  # nonce, one byte of plaintext, tag
    nonce = box[head : head + 12]
    assert box[head + 12 :] == _fifth(node, "driver:a", nonce, b"\x07", context.encode() + b"|0/1|")
    nothing = driver.seal(None, "node:n0", "exec|s|j")  # a sealed None: its tag alone
    head_a = len(BOX_MAGIC) + 1 + len(b"driver:a") + 16
    assert type(nothing) is bytes and len(nothing) == head_a + 12 + 16  # nonce and tag
    for value in (True, -1, 1 << 40, 0.25, "é€"):  # each in fewer bytes than the record
        sealed = node.seal(value, "driver:a", context)
        assert type(sealed) is bytes and len(sealed) < head + 12 + len(FIXINT_FRAMES[0][1]) + 16
        assert driver.open(sealed, context, sender="node:n0") == ("node:n0", value)


def _first_format(node: Sealer, value: int, context: str, magic: bytes) -> bytes:
    """A box of ``value`` as the first format held it (its scalar inside the codec's record),
    under ``magic``, sealed with the node's real epoch, nonce and associated data."""
    nonce = _next_nonce(node, "driver:a")
    plain = FIXINT_FRAMES[value][1]
    aad = context.encode() + b"|0/1|"
    return _head(node, "driver:a", magic) + nonce + _fifth(node, "driver:a", nonce, plain, aad)


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


def test_a_box_of_up_to_64_bytes_is_prefix_keyed_blake2b_and_a_larger_one_aes_gcm() -> None:
    """The cipher goes by the plaintext's length: a small scalar or a short codec header
    (at most 64 bytes) under prefix-keyed BLAKE2b, encrypt-then-MAC, anything larger under
    AES-256-GCM; each box's bytes are those written out here from the epoch's keys, and each
    opens, at the recipient's general path and its short path; changed, none does."""
    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, str)
    for job, value in enumerate((7, "short", list(range(3)), "x" * 7, list(range(100)))):
        context = done_context("s", f"j{job}", 0)
        box = node.seal(value, "driver:a", context)
        assert type(box) is bytes
        at = len(_head(node, "driver:a", BOX_MAGIC))
        nonce, sealed = box[at : at + 12], box[at + 12 :]
        aad = context.encode() + b"|0/1|"
        # the plaintext is as long as the ciphertext's part before the tag, either way
        plain = _plain_of(value, node)
        assert len(sealed) == len(plain) + 16
        assert sealed == _fifth(node, "driver:a", nonce, plain, aad)
        assert opener(f"j{job}", {0: {0: box}}) == {0: {0: value}}
        assert driver.open(box, context, sender="node:n0") == ("node:n0", value)
    assert len(_plain_of(list(range(100)), node)) > 64 >= len(_plain_of(list(range(3)), node))
    # a box cut or lengthened (so that it would go to the other cipher, or read another
    # split between ciphertext and associated data), or with any byte flipped (its head,
    # nonce, ciphertext or tag), fails authentication: at a new epoch and at a known one
    driver, node = sealer_pair()
    context = done_context("s", "j", 0)
    box = node.seal("x" * 7, "driver:a", context)  # 8 bytes of plaintext
    big = node.seal(list(range(100)), "driver:a", context)  # more than 64
    assert type(box) is bytes and type(big) is bytes
    at = len(_head(node, "driver:a", BOX_MAGIC)) + 12
    opener = result_opener(driver, {0: "node:n0"}, "s", True, str)
    changed = [box[:-1], box + b"\0", box[:at] + box[at + 1 :], big[: at + 64 + 16]]
    changed += [box[:i] + bytes([box[i] ^ 1]) + box[i + 1 :] for i in range(len(box))]
    for bad in changed:
        with pytest.raises(AuthenticationError):
            driver.open(bad, context, sender="node:n0")
    assert opener("j", {0: {0: box}}) == {0: {0: "x" * 7}}  # the epoch known
    for bad in changed:
        with pytest.raises(AuthenticationError):
            opener("j", {0: {0: bad}})


def _plain_of(value: object, sealer: Sealer) -> bytes:
    """What ``sealer`` puts in a box of ``value`` (a raw scalar, or the codec's header)."""
    from mpl.wire.codec import encode
    from mpl.wire.seal_payload import Payload, raw_scalar

    raw = raw_scalar(value)
    return raw if raw is not None else bytes(encode(Payload(value))[1])


def test_a_box_of_the_second_format_is_refused_with_its_magic_or_the_current_one() -> None:
    """A box as the second format sealed it (AES-256-GCM, the magic not authenticated) does
    not open, under its own magic (malformed) or with the magic rewritten to the current one
    (the keys and the associated data name the format): at a driver meeting its epoch
    first, at a driver's short path (the epoch known), and at a worker for an Exec's
    bindings, a value or a sealed None alike."""
    driver, node = sealer_pair()
    first = done_context("s", "j1", 0)
    for magic in (_SECOND_MAGIC, BOX_MAGIC):
        with pytest.raises(AuthenticationError):  # its epoch new here
            driver.open(_second_format(node, "driver:a", b"\x07", first, magic), first)
    good = node.seal(7, "driver:a", first)
    opener = result_opener(driver, {0: "node:n0"}, "s", True, str)
    assert opener("j1", {0: {0: good}}) == {0: {0: 7}}  # the epoch known: the short path
    later = done_context("s", "j2", 0)
    for magic in (_SECOND_MAGIC, BOX_MAGIC):
        with pytest.raises(AuthenticationError):
            opener("j2", {0: {0: _second_format(node, "driver:a", b"\x07", later, magic)}})
        with pytest.raises(AuthenticationError):
            driver.open(_second_format(node, "driver:a", b"\x07", later, magic), later)
    # a driver's bindings and sealed Nones of the second format, at a worker
    worker = WorkerSeal(node, 0)
    for i, magic in enumerate((_SECOND_MAGIC, BOX_MAGIC, _SECOND_MAGIC, BOX_MAGIC)):
        job = f"k{i}"
        msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        if i < 2:
            old = _second_format(driver, "node:n0", b"\x91\x01", context, magic)  # [1]
        else:
            old = _second_none(driver, "node:n0", context, magic)
        assert type(worker.open_exec(msg, job, old)) is Failed
    ran = exec_context("s", "k9", "d", (0,), (0,), 5.0)
    msg = Exec("s", "k9", "d", (0,), {}, (0,), 5.0)
    assert worker.open_exec(msg, "k9", driver.seal([1], "node:n0", ran, safe=False)) == [1]
    # and a None of the second format, its stream's Nones known (the worker's short path)
    for i in range(3):
        job = f"n{i}"
        msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        assert worker.open_exec(msg, job, driver.seal(None, "node:n0", context)) is None
    for i, magic in enumerate((_SECOND_MAGIC, BOX_MAGIC)):
        job = f"m{i}"
        msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        assert (
            type(worker.open_exec(msg, job, _second_none(driver, "node:n0", context, magic)))
            is Failed
        )


def _relabelled(box: object, magic: bytes) -> bytes:
    """``box`` (a compact box) under another format's ``magic``."""
    assert type(box) is bytes
    return magic + box[len(magic) :]


def test_a_box_of_the_third_format_is_refused_and_a_fourth_relabelled_third_too() -> None:
    """A box as the third format sealed it (keyed BLAKE2b) does not open under its own magic
    (malformed) nor relabelled as the fourth (other keys, another hash, the magic in the
    associated data); nor does a fourth-format box relabelled as the third: at a driver
    meeting the epoch first, at its short path (the epoch known), and at a worker for
    bindings and sealed Nones, by its full path and its short path (the stream's Nones
    known)."""
    driver, node = sealer_pair()
    first = done_context("s", "j1", 0)
    for magic in (_THIRD_MAGIC, BOX_MAGIC):
        with pytest.raises(AuthenticationError):  # its epoch new here
            driver.open(_third_format(node, "driver:a", b"\x07", first, magic), first)
    with pytest.raises(AuthenticationError, match="malformed"):
        driver.open(_relabelled(node.seal(7, "driver:a", first), _THIRD_MAGIC), first)
    good = node.seal(7, "driver:a", first)
    opener = result_opener(driver, {0: "node:n0"}, "s", True, str)
    assert opener("j1", {0: {0: good}}) == {0: {0: 7}}  # the epoch known: the short path
    for i, magic in enumerate((_THIRD_MAGIC, BOX_MAGIC)):
        later = done_context("s", f"j{i + 2}", 0)
        with pytest.raises(AuthenticationError):
            opener(f"j{i + 2}", {0: {0: _third_format(node, "driver:a", b"\x07", later, magic)}})
        with pytest.raises(AuthenticationError):
            driver.open(_third_format(node, "driver:a", b"\x07", later, magic), later)
        relabelled = _relabelled(node.seal(7, "driver:a", later), _THIRD_MAGIC)
        with pytest.raises(AuthenticationError):
            opener(f"j{i + 2}", {0: {0: relabelled}})
    # a driver's bindings and sealed Nones of the third format, and the fourth's relabelled
    worker = WorkerSeal(node, 0)

    def refused(job: str, make: object) -> None:
        msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        assert callable(make)
        assert type(worker.open_exec(msg, job, make(context))) is Failed

    for i, magic in enumerate((_THIRD_MAGIC, BOX_MAGIC)):
        refused(f"k{i}", lambda c, m=magic: _third_format(driver, "node:n0", b"\x91\x01", c, m))
        refused(f"l{i}", lambda c, m=magic: _third_none(driver, "node:n0", c, m))
    refused("k3", lambda c: _relabelled(driver.seal([1], "node:n0", c, safe=False), _THIRD_MAGIC))
    refused("l3", lambda c: _relabelled(driver.seal(None, "node:n0", c), _THIRD_MAGIC))
    # the stream's Nones known: the worker's short path refuses them too
    for i in range(3):
        job = f"n{i}"
        msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        assert worker.open_exec(msg, job, driver.seal(None, "node:n0", context)) is None
    refused("m0", lambda c: _third_none(driver, "node:n0", c, BOX_MAGIC))
    refused("m1", lambda c: _third_none(driver, "node:n0", c, _THIRD_MAGIC))
    refused("m2", lambda c: _relabelled(driver.seal(None, "node:n0", c), _THIRD_MAGIC))
    job = "n9"  # and the stream still runs its next None
    msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
    context = exec_context("s", job, "d", (0,), (0,), 5.0)
    assert worker.open_exec(msg, job, driver.seal(None, "node:n0", context)) is None


def test_a_box_of_the_fourth_format_is_refused_naming_its_format_and_a_fifth_relabelled() -> None:
    """A box as the fourth format sealed it (a pad hashed for every box) does not open under
    its own magic (refused as a box of format 4, the error says so) nor relabelled as the
    fifth (other keys: the personalisations name the format); nor does a fifth-format box
    relabelled as the fourth: at a driver meeting the epoch first, at its short path, and at
    a worker for bindings and sealed Nones, by its full path and its short path."""
    driver, node = sealer_pair()
    first = done_context("s", "j1", 0)
    with pytest.raises(AuthenticationError, match="a box of format 4, where this process reads"):
        driver.open(_fourth_format(node, "driver:a", b"\x07", first, _FOURTH_MAGIC), first)
    with pytest.raises(AuthenticationError, match="failed authentication"):
        driver.open(_fourth_format(node, "driver:a", b"\x07", first, BOX_MAGIC), first)
    with pytest.raises(AuthenticationError, match="format 4"):
        driver.open(_relabelled(node.seal(7, "driver:a", first), _FOURTH_MAGIC), first)
    good = node.seal(7, "driver:a", first)
    opener = result_opener(driver, {0: "node:n0"}, "s", True, str)
    assert opener("j1", {0: {0: good}}) == {0: {0: 7}}  # the epoch known: the short path
    for i, magic in enumerate((_FOURTH_MAGIC, BOX_MAGIC)):
        later = done_context("s", f"j{i + 2}", 0)
        for plain in (b"\x07", b"\xa5hello"):  # a one-byte box, a longer one
            old = _fourth_format(node, "driver:a", plain, later, magic)
            with pytest.raises(AuthenticationError):
                opener(f"j{i + 2}", {0: {0: old}})
            with pytest.raises(AuthenticationError):
                driver.open(old, later)
        relabelled = _relabelled(node.seal(7, "driver:a", later), _FOURTH_MAGIC)
        with pytest.raises(AuthenticationError, match="format 4"):
            opener(f"j{i + 2}", {0: {0: relabelled}})
    worker = WorkerSeal(node, 0)

    def refused(job: str, make: object) -> str:
        msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        assert callable(make)
        failed = worker.open_exec(msg, job, make(context))
        assert type(failed) is Failed
        return failed.error.message

    for i, magic in enumerate((_FOURTH_MAGIC, BOX_MAGIC)):
        refused(f"k{i}", lambda c, m=magic: _fourth_format(driver, "node:n0", b"\x91\x01", c, m))
        refused(f"l{i}", lambda c, m=magic: _fourth_none(driver, "node:n0", c, m))
    said = refused("l9", lambda c: _fourth_none(driver, "node:n0", c, _FOURTH_MAGIC))
    assert "a box of format 4" in said
    refused("k3", lambda c: _relabelled(driver.seal([1], "node:n0", c, safe=False), _FOURTH_MAGIC))
    refused("l3", lambda c: _relabelled(driver.seal(None, "node:n0", c), _FOURTH_MAGIC))
    # the stream's Nones known: the worker's short path refuses them too
    for i in range(3):
        job = f"n{i}"
        msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        assert worker.open_exec(msg, job, driver.seal(None, "node:n0", context)) is None
    refused("m0", lambda c: _fourth_none(driver, "node:n0", c, BOX_MAGIC))
    refused("m1", lambda c: _fourth_none(driver, "node:n0", c, _FOURTH_MAGIC))
    refused("m2", lambda c: _relabelled(driver.seal(None, "node:n0", c), _FOURTH_MAGIC))
    job = "n9"  # and the stream still runs its next None
    msg = Exec("s", job, "d", (0,), {}, (0,), 5.0)
    context = exec_context("s", job, "d", (0,), (0,), 5.0)
    assert worker.open_exec(msg, job, driver.seal(None, "node:n0", context)) is None
