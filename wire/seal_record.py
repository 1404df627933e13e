"""The cipher of a ``Sealed`` record (``mpl.wire.seal``): a payload with buffer frames (large
inputs, fetch replies of arrays) or a program. No I/O, no state: the caller gives the
direction's key (HKDF-SHA256 of the two parties' X25519 secret) and checks the sender.

* **Key.** A fresh key per payload: keyed BLAKE2b (a PRF) of the direction's key over the
  payload's 16-byte salt (unique: its sealer's epoch and number, or random) and its
  context (``mpl.wire.seal_contexts``).
* **Cipher.** ChaCha20-Poly1305 (the ``cryptography`` package, OpenSSL underneath): its
  ``encrypt_into``/``decrypt_into`` work on buffers, so large arrays are sealed straight
  from their memory in :data:`CHUNK` pieces and opened straight into one new buffer, with
  no extra full copy. Every piece is authenticated with its index and the whole layout
  (the pieces' count and the buffers' sizes), so pieces cannot be dropped, reordered or
  moved between payloads; a peer's pieces are checked to be flat byte buffers of exactly
  the sizes the layout gives before the cipher sees them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from mpl.wire.codec import ZERO_COPY_BYTES
from mpl.wire.errors import AuthenticationError
from mpl.wire.seal_payload import flat_size, flat_view
from mpl.wire.sealed import Sealed

__all__ = ["CHUNK", "SALT", "layout", "open_record", "seal_record"]

CHUNK = 1 << 20  # large buffers are sealed in pieces of this size
SALT = 16  # a record's salt
_TAG = 16  # Poly1305 tag per piece


def _pieces(size: int) -> int:
    return max(1, -(-size // CHUNK))


def _nonce(index: int) -> bytes:
    return index.to_bytes(12, "big")  # a fresh key per payload: a counter never repeats


def layout(total: int, sizes: list[int]) -> bytes:
    """What every piece's associated data ends with: the pieces' count and buffers' sizes."""
    return f"/{total}|{','.join(map(str, sizes))}".encode()


def _cipher(pair: bytes, salt: bytes, context: str) -> ChaCha20Poly1305:
    # a fresh key per payload: keyed BLAKE2b (a PRF) over salt and context
    key = hashlib.blake2b(salt + context.encode(), key=pair, digest_size=32).digest()
    return ChaCha20Poly1305(key)


def seal_record(pair: bytes, sender: str, salt: bytes, context: str, frames: list[Any]) -> Sealed:
    """The codec's ``frames`` (its magic, header, then buffers) sealed under the direction's
    key ``pair`` by ``sender`` with ``salt`` for ``context``."""
    views = [flat_view(b) for b in frames[2:]]
    sizes = [v.nbytes for v in views]
    aead = _cipher(pair, salt, context)
    total = 1 + sum(_pieces(s) for s in sizes)
    laid = layout(total, sizes)
    parts: list[Any] = [aead.encrypt(_nonce(0), frames[1], b"0" + laid)]
    index = 1
    for view in views:
        for start in range(0, max(view.nbytes, 1), CHUNK):
            piece = view[start : start + CHUNK]
            aad = str(index).encode() + laid
            if piece.nbytes + _TAG < ZERO_COPY_BYTES:
                parts.append(aead.encrypt(_nonce(index), piece, aad))
            else:
                out = bytearray(piece.nbytes + _TAG)
                aead.encrypt_into(_nonce(index), piece, aad, out)
                parts.append(memoryview(out))  # travels as a frame, opened without a copy
            index += 1
    return Sealed(sender, salt, sizes, parts)


def check_record(sealed: Sealed) -> None:
    """Raise :class:`AuthenticationError` unless ``sealed`` (as a peer sent it) is laid out
    as a record is: a salt of :data:`SALT` bytes, sizes that are ints, and pieces that are
    flat byte buffers of the sizes those give. Checked before any key is made."""
    sizes, parts = sealed.sizes, sealed.parts
    if len(sealed.salt) != SALT or not all(type(s) is int and s >= 0 for s in sizes):
        raise AuthenticationError("malformed sealed payload")
    total = 1 + sum(_pieces(s) for s in sizes)
    if len(parts) != total or not _sizes_match(sizes, parts):
        raise AuthenticationError("a sealed payload lost, gained or resized pieces")


def open_record(pair: bytes, sealed: Sealed, context: str) -> tuple[bytes, list[Any]]:
    """The header and buffers of ``sealed`` (checked by :func:`check_record`) under the
    direction's key ``pair`` for ``context``; ``InvalidTag`` unless every piece
    authenticates."""
    sizes, parts = sealed.sizes, sealed.parts
    laid = layout(len(parts), sizes)
    aead = _cipher(pair, sealed.salt, context)
    header: bytes = aead.decrypt(_nonce(0), parts[0], b"0" + laid)
    bufs: list[Any] = []
    index = 1
    for size in sizes:
        out = memoryview(bytearray(size))
        for start in range(0, max(size, 1), CHUNK):
            aad = str(index).encode() + laid
            aead.decrypt_into(_nonce(index), parts[index], aad, out[start : start + CHUNK])
            index += 1
        bufs.append(out)
    return header, bufs


def _sizes_match(sizes: list[int], parts: list[Any]) -> bool:
    """Whether ``parts`` (as a peer sent them) are flat byte buffers of the sizes a record
    of payloads ``sizes`` has: anything else (an array a safe decode built, say) is refused
    here, before the cipher sees it."""
    try:
        if flat_size(parts[0]) < _TAG:
            return False
        index = 1
        for size in sizes:
            for start in range(0, max(size, 1), CHUNK):
                want = min(CHUNK, size - start) + _TAG
                if flat_size(parts[index]) != want:
                    return False
                index += 1
    except TypeError:
        return False
    return True
