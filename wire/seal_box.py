"""The cipher of a compact box (``mpl.wire.seal``): prefix-keyed BLAKE2b, encrypt-then-MAC, for a
plaintext of at most :data:`ETM_MAX` bytes (every trivial job's answer: one byte; a short
codec header), AES-256-GCM (``cryptography``) for a larger one, each under its own key of
the sealing process's epoch. No I/O, no state but the keyed hashes set up once per epoch.

* **Keys.** :func:`epoch_keys`: from the direction's key (HKDF-SHA256 of the two parties'
  X25519 secret, ``mpl.wire.seal``), four keys per epoch, each keyed BLAKE2b-256 (a PRF)
  of the epoch's 16 bytes under it, told apart by their personalisation: the pad's, the
  tag's, AES-GCM's, and a sealed None's tag key. Each personalisation ends with the box
  format's version ("/5", ``BOX_MAGIC``'s last byte): a box of another format meets other
  keys.
* **Prefix-keyed BLAKE2b (format 4).** The pad, the tag and a sealed None's tag are each
  BLAKE2b, without BLAKE2's key parameter, of the 32-byte key then the bytes it
  authenticates (under the key's personalisation; the parameter block differs from the
  derivation's in its key length, so the two never meet): ``PRF(K, m) = BLAKE2b(K || m)``.
  BLAKE2b has no length extension (its last block is compressed under a finalisation
  flag) and the key is a fixed-length prefix, so every input parses one way: a PRF and
  MAC as keyed BLAKE2b is, by the same argument as for a keyed hash whose key is the
  first block. It costs one compression for up to 96 bytes after the key, where
  CPython's keyed BLAKE2b takes two at least (its key padded to a whole block, compressed
  at every use): a trivial job's box tag (about 90 bytes), pad (12) and sealed None
  (about 80) take one each. Format 3 (keyed BLAKE2b) and format 4 (a pad hashed for every
  box) boxes are refused.
* **Encrypt.** The ciphertext is the plaintext XOR the first bytes of the pad, BLAKE2b-512
  of the 12-byte nonce prefix-keyed by the pad key: a PRF evaluated once per nonce, and
  the nonce (the epoch's counter) never repeats under one epoch's keys (a forked process
  draws new epochs), so each pad is used once, as a stream cipher's counter mode uses its
  keystream.
* **A one-byte plaintext (format 5)** (a small int, a bool: nearly every trivial job's
  answer) takes one byte of a *run* of pads instead: the nonces ``64 r`` to ``64 r + 63``
  share run ``r``'s 64 bytes, BLAKE2b-512 prefix-keyed by the pad key of ``r`` as 13
  bytes (big-endian), and nonce ``n`` takes byte ``n mod 64`` of run ``n // 64``. A run's
  input is a byte longer than any nonce, so no run's pad is any nonce's; each nonce still
  takes its own byte, once. A sealer and a recipient keep the last run's pad per epoch
  (:func:`run_pads`), so a stream of one-byte boxes hashes a pad once per 64 of them on
  either side instead of once each (about 2.5k instructions a box, each side). The kept
  run is one tuple, replaced whole: a thread reads a run's number and its pad together.
  The tag is checked before the pad is looked at, as for any box.
* **MAC.** The tag is BLAKE2b-128, prefix-keyed by the separate tag key, of the nonce, the
  plaintext's length (one byte: the split between ciphertext and associated data is fixed,
  so no box reads as another with bytes moved between the two), the ciphertext and the
  associated data (the payload's context, its layout, then the box format's magic, so the
  version is authenticated too). The recipient checks it with ``hmac.compare_digest`` (in
  constant time) before it makes the pad: nothing unauthenticated is decrypted.
* **Why it is sound.** Encrypt-then-MAC of an IND-CPA cipher (a PRF keystream under unique
  nonces) with a strongly unforgeable MAC (a PRF tag) under independent keys is an
  authenticated encryption (Bellare and Namprempre); BLAKE2b over a secret fixed-length
  prefix is taken as a PRF and MAC (BLAKE2 has no length extension). This is not RFC 7693's
  keyed mode, which pads the key to a block of its own: here the attacker's bytes share the
  first compression with the key, so it rests on the compression function being a PRF when
  keyed through part of its message input, as BLAKE2's mode proofs model it. The keys are
  independent PRF outputs. A 128-bit tag, as AES-GCM's.
* **Which cipher.** The ciphertext's length (authenticated by either) says which: at most
  :data:`ETM_MAX` bytes of plaintext, BLAKE2b; more, AES-256-GCM with the same nonce and
  associated data under its own key. A large plaintext would take one BLAKE2b call per 64
  bytes of pad, where AES-GCM is cheaper per byte.
* **Why BLAKE2b for small boxes.** Not for instructions alone: per seal or open it took
  about 16k where AES-GCM takes 7k while it was keyed BLAKE2b (format 3: CPython's BLAKE2b
  compresses the key block at every use, two compressions per hash; prefix-keyed, one,
  about 1.7k less per hash). But a trivial job's cipher calls run between other processes'
  work, on caches those evicted, and OpenSSL's AEAD path is far more code to bring back
  than CPython's BLAKE2b, which the job runs anyway for its sealed Nones' tags. Measured
  with 8 MiB touched between calls, a small box's seal and open took 23 µs under AES-GCM
  and 12.5 µs under BLAKE2b (32 MiB: 65 and 25 µs; warm: 1.6 and 2.9 µs), and secure
  trivial jobs ran faster by p50 (README, Performance).
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["ETM_MAX", "RUN", "BoxKeys", "box_open", "box_seal", "epoch_keys", "run_pads"]

ETM_MAX = 64  # the largest plaintext sealed by BLAKE2b: one BLAKE2b-512 output of pad
_TAG = 16
# each epoch key's personalisation; "/5": the box format's version
_EPOCH_PERSON = b"mpl-box-epoch/5"  # AES-256-GCM, for a box of more than ETM_MAX bytes
_PAD_PERSON = b"mpl-box-pad/5"  # the pad of a box of at most ETM_MAX bytes (and runs')
_MAC_PERSON = b"mpl-box-mac/5"  # that box's tag
_MARK_PERSON = b"mpl-box-mark/5"  # a sealed None's tag (mpl.wire.seal)
_KEY = 32  # each epoch key's bytes: the prefix of every input it keys
_ONE_BYTE = tuple(bytes([n]) for n in range(256))
_LENGTHS = _ONE_BYTE[: ETM_MAX + 1]  # a plaintext's length, as its tag's input holds it
RUN = 64  # nonces per run of one-byte pads: one BLAKE2b-512 output, a byte each
_RUN_SHIFT = 6  # a nonce's run: its number >> this; its byte in the run: number & (RUN - 1)
_RUN_INPUT = 13  # a run's number as its pad's input holds it: a byte longer than a nonce
_NO_RUN = (-1, b"")
_number = int.from_bytes  # a nonce's number (big-endian), the classmethod bound once

# an epoch's box ciphers: the pad's and the tag's prefix-keyed BLAKE2b (each a hash that
# has taken its key, set up once: each use copies one), AES-256-GCM for larger boxes, and
# the epoch's last run of one-byte pads, (run, its 64 bytes), in a one-slot list (run_pads)
BoxKeys = tuple[hashlib.blake2b, hashlib.blake2b, AESGCM, list[tuple[int, bytes]]]


def epoch_keys(pair: bytes, epoch: bytes) -> tuple[BoxKeys, hashlib.blake2b]:
    """The box ciphers of ``epoch`` under a direction's key ``pair``, and the prefix-keyed
    hash of its sealed Nones' tags (16 bytes each)."""

    def key(person: bytes) -> bytes:
        return hashlib.blake2b(epoch, key=pair, digest_size=_KEY, person=person).digest()

    def keyed(person: bytes, size: int) -> hashlib.blake2b:
        # prefix-keyed: the key buffered, not compressed, so each use (a copy fed its own
        # bytes) compresses key and bytes in one block while they fit 128 bytes
        made = hashlib.blake2b(digest_size=size, person=person)
        made.update(key(person))
        return made

    keys = (
        keyed(_PAD_PERSON, ETM_MAX),
        keyed(_MAC_PERSON, _TAG),
        AESGCM(key(_EPOCH_PERSON)),
        [_NO_RUN],
    )
    return keys, keyed(_MARK_PERSON, _TAG)


def run_pads(keys: BoxKeys, run: int) -> bytes:
    """The 64 pad bytes of run ``run`` (nonces ``64 run`` to ``64 run + 63``) of an epoch's
    ``keys``: its one-byte boxes' pads, nonce ``n``'s at ``n % 64`` of run ``n >> 6``. Kept
    as the epoch's last run (replaced whole, one tuple: any thread), so the next 63 boxes
    of a stream find theirs without a hash; a hot path reads ``keys[3][0]`` itself and
    calls this only for another run."""
    pad = keys[0].copy()
    pad.update(run.to_bytes(_RUN_INPUT, "big"))
    pads = pad.digest()
    keys[3][0] = (run, pads)
    return pads


def box_seal(keys: BoxKeys, nonce: bytes, plain: bytes, aad: bytes) -> bytes:
    """A compact box's ciphertext and tag: of ``plain`` (1 to ``COMPACT_MAX`` bytes) under
    an epoch's ``keys``, with ``nonce`` (the epoch's counter: never twice under one epoch)
    and associated data ``aad`` (the context, then the layout and the box format's magic).
    Prefix-keyed BLAKE2b, encrypt-then-MAC, up to ``ETM_MAX`` bytes; AES-256-GCM above."""
    size = len(plain)
    if size > ETM_MAX:
        return keys[2].encrypt(nonce, plain, aad)
    if size == 1:  # the commonest (a small int, a bool): its byte of its nonce's run
        seq = _number(nonce)
        run, pads = keys[3][0]
        if seq >> _RUN_SHIFT != run:
            pads = run_pads(keys, seq >> _RUN_SHIFT)
        hidden = _ONE_BYTE[plain[0] ^ pads[seq & (RUN - 1)]]
    else:
        pad = keys[0].copy()
        pad.update(nonce)
        hidden = (int.from_bytes(plain) ^ int.from_bytes(pad.digest()[:size])).to_bytes(size)
    tag = keys[1].copy()
    tag.update(b"".join((nonce, _LENGTHS[size], hidden, aad)))
    return hidden + tag.digest()


def box_open(keys: BoxKeys, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
    """The plaintext of a compact box's ciphertext and tag (``sealed``, as
    :func:`box_seal` makes them, of at least one byte of plaintext); ``InvalidTag`` unless
    it authenticates, before any pad is made."""
    size = len(sealed) - _TAG
    if size > ETM_MAX:
        opened: bytes = keys[2].decrypt(nonce, sealed, aad)
        return opened
    if size < 1:
        raise InvalidTag
    hidden = sealed[:size]
    tag = keys[1].copy()
    tag.update(b"".join((nonce, _LENGTHS[size], hidden, aad)))
    if not hmac.compare_digest(sealed[size:], tag.digest()):
        raise InvalidTag
    if size == 1:  # its byte of its nonce's run (authenticated: the nonce is in the tag)
        seq = _number(nonce)
        run, pads = keys[3][0]
        if seq >> _RUN_SHIFT != run:
            pads = run_pads(keys, seq >> _RUN_SHIFT)
        return _ONE_BYTE[hidden[0] ^ pads[seq & (RUN - 1)]]
    pad = keys[0].copy()
    pad.update(nonce)
    return (int.from_bytes(hidden) ^ int.from_bytes(pad.digest()[:size])).to_bytes(size)
