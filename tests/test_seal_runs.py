"""A one-byte box's pad is a byte of its nonce's run (format 5, ``mpl.wire.seal_box``): 64
nonces share one BLAKE2b-512 output, kept per epoch by the sealer and by the recipient, so
a stream of small answers hashes a pad once per 64 boxes on either side.

The kept run is a shortcut: every test here checks the boxes it makes and opens against the
format written out from the epoch's raw keys with no run kept (``_fifth``), across runs, out
of order, interleaved with the general path, after damaged boxes and from two threads at
once; and counts the pad hashes the shortcut saves."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import pytest
from helpers import sealer_pair
from test_seal_box_format import _fifth

from mpl.wire.errors import AuthenticationError
from mpl.wire.result_open import result_opener
from mpl.wire.seal import _COMPACT_AAD, Sealer, _box_nonce, done_context
from mpl.wire.seal_box import RUN, box_seal
from mpl.wire.seal_payload import RAW_FIXINT, RAW_ONE_BYTE

_HEAD = len(b"MB\x05") + 1 + len(b"node:n0") + 16  # a node's box head: its nonce follows


def _unknown(rank: int) -> str:
    raise AuthenticationError(f"rank {rank} has no node here")


def _nonce_of(box: bytes) -> int:
    return int.from_bytes(box[_HEAD : _HEAD + 12], "big")


def _check(node: Sealer, box: bytes, plain: bytes, job: str, index: int = 0) -> None:
    """``box`` is ``plain`` sealed as the format writes it, from the raw keys (no run kept)."""
    nonce = box[_HEAD : _HEAD + 12]
    aad = done_context("s", job, index).encode() + b"|0/1|"
    assert box[_HEAD + 12 :] == _fifth(node, "driver:a", nonce, plain, aad), (job, plain)


def _scalar_box(node: Sealer, value: int, job: str, index: int = 0) -> bytes:
    boxes = node.seal_scalars({index: value}, "driver:a", f"done|s|{job}|")
    assert boxes is not None
    return boxes[index]


def _raw_box(node: Sealer, plain: bytes, job: str, index: int = 0) -> bytes:
    """A box of any ``plain`` by the general path (``box_seal``), with the epoch's next nonce."""
    head, keys, _, counter = node._sending["driver:a"]
    nonce = _box_nonce(next(counter))
    aad = done_context("s", job, index).encode() + _COMPACT_AAD
    return bytes(b"".join((head, nonce, box_seal(keys, nonce, plain, aad))))


def _skip(node: Sealer, numbers: int) -> None:
    """Draw ``numbers`` of the node's epoch numbers unused (a sealer's gaps: Nones, renews)."""
    counter = node._sending["driver:a"][3]
    for _ in range(numbers):
        next(counter)


def test_every_one_byte_box_across_runs_is_the_format_written_out_and_opens_both_ways() -> None:
    """Every fixint by the worker's hot path (``seal_scalars``) and every byte by the general
    path (``box_seal``), their nonces crossing several runs and gaps of unused numbers, each
    box byte for byte the format written out from the raw keys; opened in a shuffled order
    (the kept run changing back and forth) by the driver's short path and by its general
    path, each to its plaintext."""
    driver, node = sealer_pair()
    node.seal(0, "driver:a", "warm")  # the epoch drawn (number 0)
    made: list[tuple[bytes, bytes, str, Any]] = []
    rng = random.Random(5)
    for value in range(-32, 128):
        job = f"f{value}"
        box = _scalar_box(node, value, job)
        _check(node, box, RAW_FIXINT[value], job)
        made.append((box, RAW_FIXINT[value], job, value))
        if rng.random() < 0.1:
            _skip(node, rng.randrange(1, 90))
    for byte in range(256):
        job = f"b{byte}"
        box = _raw_box(node, bytes([byte]), job)
        _check(node, box, bytes([byte]), job)
        made.append((box, bytes([byte]), job, None))
        if rng.random() < 0.1:
            _skip(node, rng.randrange(1, 90))
    runs = {_nonce_of(box) // RUN for box, *_ in made}
    assert len(runs) >= 8  # several runs, each box's byte its own
    assert len({_nonce_of(box) for box, *_ in made}) == len(made)
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)
    rng.shuffle(made)
    opened = 0
    for box, plain, job, value in made:
        general = _outcome(lambda b=box, j=job: driver.open(b, done_context("s", j, 0))[1])
        short = _outcome(lambda b=box, j=job: opener(j, {0: {0: b}})[0][0])
        assert short == general, (plain, short, general)
        assert short[0] != "AuthenticationError"  # (a byte the codec refuses: ProtocolError)
        if value is not None:
            assert short == ("opened", (int, value))
        elif plain in RAW_ONE_BYTE:
            assert short == ("opened", (type(RAW_ONE_BYTE[plain]), RAW_ONE_BYTE[plain]))
        opened += short[0] == "opened"
    assert opened >= 160 + 160 + 3  # the fixints twice, None and the bools at least


def _outcome(open_it: Any) -> tuple[str, Any]:
    """What opening gave: its value and type, or the error's type and message."""
    try:
        value = open_it()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "opened", (type(value), value)


def test_a_damaged_box_changes_no_kept_run_and_the_next_good_one_opens() -> None:
    """A box refused (a byte changed, its nonce moved to another run, its tag another's) is
    refused before its pad is looked at: the kept run stays as it was, on the sealer's side
    and the recipient's, and the boxes that follow open to their values."""
    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)
    first = _scalar_box(node, 1, "j0")
    assert opener("j0", {0: {0: first}}) == {0: {0: 1}}  # its epoch known: the short path
    keys = driver._receiving[first[:_HEAD]][1]
    for n in range(1, 300):
        job = f"j{n}"
        value = n % 100
        good = _scalar_box(node, value, job)
        _check(node, good, RAW_FIXINT[value], job)
        kept = keys[3][0]
        bad = bytearray(good)
        how = n % 4
        if how == 0:  # its nonce moved forward by a run (and the tag left as it was)
            moved = (_nonce_of(good) + RUN).to_bytes(12, "big")
            bad[_HEAD : _HEAD + 12] = moved
        elif how == 1:  # its one byte of ciphertext changed
            bad[_HEAD + 12] ^= 0x40
        elif how == 2:  # a tag bit
            bad[-1] ^= 1
        else:  # cut
            bad = bad[:-1]
        with pytest.raises(AuthenticationError):
            opener(job, {0: {0: bytes(bad)}})
        with pytest.raises(AuthenticationError):
            driver.open(bytes(bad), done_context("s", job, 0), sender="node:n0")
        assert keys[3][0] is kept  # no pad made for what did not authenticate
        assert opener(job, {0: {0: good}}) == {0: {0: value}}


def test_two_threads_sealing_and_opening_on_one_epoch_each_get_their_own_bytes() -> None:
    """Two threads seal small ints for one driver under one epoch (a worker's I/O thread and
    a job thread) and two open them (a driver's caller and its pump): the kept run is read
    and replaced whole, so every box is the format written out and opens to its value."""
    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)
    assert opener("w", {0: {0: _scalar_box(node, 1, "w")}}) == {0: {0: 1}}
    boxes: dict[str, tuple[bytes, int]] = {}
    errors: list[BaseException] = []

    def seal(name: str) -> None:
        try:
            for n in range(1500):
                job, value = f"{name}{n}", n % 128
                boxes[job] = (_scalar_box(node, value, job), value)
        except BaseException as exc:  # pragma: no cover (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=seal, args=(name,)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(boxes) == 3000
    for job, (box, value) in boxes.items():
        _check(node, box, RAW_FIXINT[value], job)
    jobs = list(boxes)
    random.Random(9).shuffle(jobs)

    def open_half(half: list[str]) -> None:
        try:
            for job in half:
                box, value = boxes[job]
                assert opener(job, {0: {0: box}}) == {0: {0: value}}
        except BaseException as exc:  # pragma: no cover (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=open_half, args=(jobs[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors


def test_a_stream_of_one_byte_boxes_hashes_a_pad_once_per_run_on_either_side() -> None:
    """The saving itself: 256 answers in a row (small ints, by ``seal_scalars``), opened in
    order by the driver's short path, hash a pad about once per 64 on either side (format 4
    hashed one per box); the tag is still one hash per box."""
    import sys

    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)
    assert opener("w", {0: {0: _scalar_box(node, 1, "w")}}) == {0: {0: 1}}
    jobs = [f"j{n}" for n in range(256)]
    calls: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__qualname__", "") == "blake2b.digest":
            calls["digest"] += 1
        elif event == "call" and frame.f_code.co_name == "run_pads":
            calls["run"] += 1

    sys.setprofile(count)
    try:
        sealed = [_scalar_box(node, 7, job) for job in jobs]
    finally:
        sys.setprofile(None)
    assert calls["run"] <= 256 // RUN + 1
    assert calls["digest"] == 256 + calls["run"]  # a tag each, a pad per run
    calls.clear()
    sys.setprofile(count)
    try:
        opened = [opener(job, {0: {0: box}}) for job, box in zip(jobs, sealed, strict=True)]
    finally:
        sys.setprofile(None)
    assert opened == [{0: {0: 7}}] * 256
    assert calls["run"] <= 256 // RUN + 1
    assert calls["digest"] == 256 + calls["run"]
