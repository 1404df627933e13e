"""End-to-end sealing between a driver and a worker (secure mode): the broker routes
ciphertext it cannot read, alter or replay elsewhere.

Every payload a driver and a worker exchange through the broker (a job's bindings and its
program, inline results, fetch replies) is encoded with the codec, then encrypted and
authenticated for its one recipient:

* **Keys.** The same Curve25519 key pairs as CurveZMQ (a ZeroMQ key is an X25519 key). One
  party's secret key and the other's public key, each from its *own copy of the spec*, give
  an X25519 secret; HKDF-SHA256 turns it into one key per direction (sender, recipient),
  computed once. Each payload gets a one-use key from that one: keyed BLAKE2b over a fresh
  random salt and the payload's context (cheaper than HKDF per message: a trivial job seals
  four times, and on a busy machine each crypto call pays cold caches).
* **Binding.** The keys name the sender and the recipient, the context what it is for
  (``exec|session|job|digest``, ``done|...``, ``fetch|...|ticket``): a payload replayed into
  another job, request, slot or direction derives another key and fails to open.
* **Cipher.** ChaCha20-Poly1305 (the ``cryptography`` package, OpenSSL underneath): its
  ``encrypt_into``/``decrypt_into`` work on buffers, so large arrays are sealed straight
  from their memory in ``CHUNK`` pieces and opened straight into one new buffer, with no
  extra full copy; every piece is authenticated with its index and the whole layout, so
  pieces cannot be dropped, reordered or moved between payloads.

Opening is all-or-nothing: anything wrong raises :class:`AuthenticationError` before the
plaintext is decoded, so a pickle inside a job's bindings or program is loaded only after
the driver that sealed it has been proved to be one the worker's own spec lists.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from zmq.utils import z85

from mpl.wire.codec import MAGIC_FRAME, ZERO_COPY_BYTES, decode, encode
from mpl.wire.curve import Curve
from mpl.wire.errors import AuthenticationError, ProtocolError
from mpl.wire.identity import driver_identity, node_identity
from mpl.wire.record import Record
from mpl.wire.sealed import Sealed

__all__ = [
    "CHUNK",
    "Sealed",
    "Sealer",
    "done_context",
    "exec_context",
    "fetch_context",
    "program_context",
]

CHUNK = 1 << 20  # large buffers are sealed in pieces of this size
_SALT = 16
_TAG = 16  # Poly1305 tag per piece
_INFO = b"mpl-seal/1"


def program_context(digest: str) -> str:
    return f"program|{digest}"


def exec_context(
    session: str,
    job: str,
    digest: str,
    ranks: tuple[int, ...],
    inline: tuple[int, ...],
    timeout: float,
) -> str:
    """Everything in an ``Exec`` besides the bindings is bound too: the broker cannot change
    which ranks take part, what comes back inline, or the job's deadline."""
    return f"exec|{session}|{job}|{digest}|{list(ranks)}|{list(inline)}|{float(timeout)!r}"


def done_context(session: str, job: str, index: int) -> str:
    return f"done|{session}|{job}|{index}"


def fetch_context(session: str, rank: int, uri: str, ticket: str) -> str:
    return f"fetch|{session}|{rank}|{uri}|{ticket}"


@dataclass(eq=False, repr=False)
class _Payload(Record, tag="sealed-value"):
    value: Any


def _pieces(size: int) -> int:
    return max(1, -(-size // CHUNK))


def _nonce(index: int) -> bytes:
    return index.to_bytes(12, "big")  # a fresh key per payload: a counter never repeats


def _raw_key(z85_key: str) -> bytes:
    raw: bytes = z85.decode(z85_key.encode("ascii"))
    if len(raw) != 32:
        raise ValueError("a Curve25519 key is 32 bytes")
    return raw


class Sealer:
    """Seals for, and opens from, the counterparts this process's own spec lists.

    ``peers`` maps identities (``node:<name>`` / ``driver:<name>``) to their public keys: a
    driver's peers are the nodes, a worker's are the drivers. Nothing sealed by anyone
    else opens here.
    """

    def __init__(self, secret_z85: str, identity: str, peers: dict[str, str]) -> None:
        self.identity = identity
        self._secret = X25519PrivateKey.from_private_bytes(_raw_key(secret_z85))
        self._peers = dict(peers)
        self._pair_keys: dict[tuple[str, str], bytes] = {}

    @classmethod
    def for_node(cls, curve: Curve, rank: int) -> Sealer:
        spec = curve.cluster
        if spec is None:
            raise ValueError("a secure worker needs its own cluster spec")
        drivers = {driver_identity(d.name): d.curve_key for d in spec.drivers}
        return cls(curve.keys.secret, node_identity(spec.nodes[rank].name), drivers)

    @classmethod
    def for_driver(cls, curve: Curve) -> Sealer | None:
        """The driver's sealer, or None when its spec is unknown (only the broker's key was
        given) or does not list this driver's key: then no worker would accept its jobs."""
        spec = curve.cluster
        if spec is None:
            return None
        me = [d.name for d in spec.drivers if d.curve_key == curve.keys.public]
        if not me:
            return None
        nodes = {node_identity(n.name): n.curve_key for n in spec.nodes}
        return cls(curve.keys.secret, driver_identity(me[0]), nodes)

    def knows(self, identity: str) -> bool:
        return identity in self._peers

    # -- sealing --------------------------------------------------------------------------
    def seal(self, value: Any, to: str, context: str, *, safe: bool = True) -> Sealed:
        """Seal ``value`` for ``to`` (an identity among this sealer's peers).

        ``safe`` refuses values outside the safe value format at once (what a worker sends
        a driver); a driver sealing functions for a worker passes ``safe=False``.
        """
        frames = encode(_Payload(value), safe=safe)
        salt = os.urandom(_SALT)
        views = [_flat(b) for b in frames[2:]]
        sizes = [v.nbytes for v in views]
        aead = self._aead(to, salt, self.identity, to, context)
        total = 1 + sum(_pieces(s) for s in sizes)
        layout = _layout(total, sizes)
        parts: list[Any] = [aead.encrypt(_nonce(0), frames[1], b"0" + layout)]
        index = 1
        for view in views:
            for start in range(0, max(view.nbytes, 1), CHUNK):
                piece = view[start : start + CHUNK]
                aad = str(index).encode() + layout
                if piece.nbytes + _TAG < ZERO_COPY_BYTES:
                    parts.append(aead.encrypt(_nonce(index), piece, aad))
                else:
                    out = bytearray(piece.nbytes + _TAG)
                    aead.encrypt_into(_nonce(index), piece, aad, out)
                    parts.append(memoryview(out))  # travels as a frame, opened without a copy
                index += 1
        return Sealed(self.identity, salt, sizes, parts)

    # -- opening --------------------------------------------------------------------------
    def open(self, sealed: Any, context: str, *, sender: str = "", safe: bool = True) -> Any:
        """Open a payload sealed for this process; ``(sealer identity, value)``.

        ``sender``, when given, is the only identity allowed to have sealed it (the rank a
        result must come from). Raises :class:`AuthenticationError` for anything not sealed
        by a peer this spec lists for exactly this context, and decodes the plaintext only
        then (``safe`` as in :func:`mpl.wire.codec.decode`).
        """
        if type(sealed) is not Sealed:
            raise AuthenticationError(
                f"expected a sealed payload ({context.split('|')[0]}), got "
                f"{type(sealed).__name__}: secure mode seals everything between a driver "
                "and a worker"
            )
        who = sealed.sender
        if sender and who != sender:
            raise AuthenticationError(f"a payload from {sender} claims to be sealed by {who}")
        if who not in self._peers:
            raise AuthenticationError(
                f"a payload claims to be sealed by {who!r}, which this process's cluster spec "
                "does not list"
            )
        sizes, parts = sealed.sizes, sealed.parts
        if len(sealed.salt) != _SALT or not all(type(s) is int and s >= 0 for s in sizes):
            raise AuthenticationError("malformed sealed payload")
        total = 1 + sum(_pieces(s) for s in sizes)
        if len(parts) != total or not self._sizes_match(sizes, parts):
            raise AuthenticationError("a sealed payload lost, gained or resized pieces")
        layout = _layout(total, sizes)
        aead = self._aead(who, sealed.salt, who, self.identity, context)
        try:
            header = aead.decrypt(_nonce(0), parts[0], b"0" + layout)
            bufs: list[Any] = []
            index = 1
            for size in sizes:
                out = memoryview(bytearray(size))
                for start in range(0, max(size, 1), CHUNK):
                    aad = str(index).encode() + layout
                    aead.decrypt_into(_nonce(index), parts[index], aad, out[start : start + CHUNK])
                    index += 1
                bufs.append(out)
        except InvalidTag:
            raise AuthenticationError(
                f"a payload sealed by {who} failed authentication ({context.split('|')[0]}): "
                "it was altered, or replayed from another job, request or party"
            ) from None
        try:
            payload = decode([MAGIC_FRAME, header, *bufs], safe=safe)
        except ProtocolError as exc:
            raise ProtocolError(f"a payload sealed by {who}: {exc}") from None
        if not isinstance(payload, _Payload):
            raise ProtocolError(f"a payload sealed by {who} holds a {payload.TAG!r} record")
        return who, payload.value

    @staticmethod
    def _sizes_match(sizes: list[int], parts: list[Any]) -> bool:
        try:
            if memoryview(parts[0]).nbytes < _TAG:
                return False
            index = 1
            for size in sizes:
                for start in range(0, max(size, 1), CHUNK):
                    want = min(CHUNK, size - start) + _TAG
                    if memoryview(parts[index]).nbytes != want:
                        return False
                    index += 1
        except TypeError:
            return False
        return True

    def _aead(
        self, peer: str, salt: bytes, sender: str, recipient: str, context: str
    ) -> ChaCha20Poly1305:
        pair = self._pair_keys.get((sender, recipient))
        if pair is None:
            public = self._peers.get(peer)
            if public is None:
                raise AuthenticationError(f"{peer!r} has no key in this process's cluster spec")
            shared = self._secret.exchange(X25519PublicKey.from_public_bytes(_raw_key(public)))
            # one key per direction between two parties, from their X25519 secret
            info = b"\0".join((_INFO, sender.encode(), recipient.encode()))
            pair = self._pair_keys[(sender, recipient)] = HKDF(SHA256(), 32, None, info).derive(
                shared
            )
        # and from it a fresh key per payload: keyed BLAKE2b (a PRF) over salt and context
        key = hashlib.blake2b(salt + context.encode(), key=pair, digest_size=32).digest()
        return ChaCha20Poly1305(key)


def _layout(total: int, sizes: list[int]) -> bytes:
    return f"/{total}|{','.join(map(str, sizes))}".encode()


def _flat(buf: Any) -> memoryview:
    view = memoryview(buf)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    return view
