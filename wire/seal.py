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
  (``exec|job|...``, ``done|...``, ``fetch|...|ticket``; ``mpl.wire.seal_contexts``):
  a payload replayed into another job, request, slot or direction derives another key and
  fails to open.
* **Cipher.** ChaCha20-Poly1305 for a ``Sealed`` record (``mpl.wire.seal_record``; the
  ``cryptography`` package, OpenSSL underneath; a compact box's is AES-GCM, below): its
  ``encrypt_into``/
  ``decrypt_into`` work on buffers, so large arrays are sealed straight from their memory
  in ``CHUNK`` pieces and opened straight into one new buffer, with no extra full copy;
  every piece is authenticated with its index and the whole layout, so pieces cannot be
  dropped, reordered or moved between payloads.

* **Compact boxes.** A payload with no buffer frames (a job's bindings, an inline result: the
  hot path) is sealed into one ``bytes`` string instead of a ``Sealed`` record, so every
  process on the way (driver, broker, worker) packs and unpacks it as plain bytes, with no
  record to build or check. Its key is not made per payload (deriving one and setting up a
  cipher for it was the largest cost of a small box): each sealing process draws a random
  16-byte *epoch* per recipient, keys it once from the direction's key (keyed BLAKE2b,
  personalised apart from the per-payload keys), and numbers its boxes with a counter, so
  no (key, nonce) pair ever repeats. The context goes into the associated data instead of
  the key: a box replayed into another job, request, slot or direction fails its tag just
  the same, and one claiming another sender or meant for another recipient meets another
  direction's key. A recipient keeps the ciphers of the epochs that opened for it (bounded;
  an epoch enters only once a box of it has authenticated). Larger payloads, and programs,
  stay ``Sealed`` records. A box of at most 64 bytes of plaintext (every trivial job's
  answer) is sealed by prefix-keyed BLAKE2b, encrypt-then-MAC (``mpl.wire.seal_box`` gives the
  construction and why it is sound), a larger one by AES-256-GCM (``cryptography``'s
  ``AESGCM``), each under its own keys of the epoch; the plaintext's length (authenticated
  either way) says which. BLAKE2b costs more instructions per box than AES-GCM (about 16k
  against 7k per seal or open), but on a busy machine each call runs on caches other
  processes evicted, and OpenSSL's AEAD path touches far more code than the BLAKE2b every
  job runs anyway (a sealed None's tag): by p50, A/B against AES-GCM boxes, secure trivial
  jobs took 0.79-1.0 x (one pcall on P0) and 0.84-1.06 x (a pcall on both ranks). A
  counter nonce under keys per epoch never repeats, which both need.
* **Versioned.** A box's format (the last byte of its magic) is authenticated: the magic
  ends every box's associated data, and every key of an epoch is derived under a
  personalisation naming the format, so a box of an earlier format (or one whose magic was
  rewritten) meets other keys and fails its tag.
* **Few bytes.** A box is three bytes of magic (its format's version last), the sender's
  name, the epoch, the nonce and the ciphertext; a small scalar's plaintext is its msgpack
  bytes alone (``mpl.wire.seal_payload.raw_scalar``: one byte for a small int), anything
  else the codec's header (a msgpack array, never read as a raw scalar). Every byte is
  encrypted and authenticated again by CurveZMQ at both ends of every hop (the broker
  relays each): the first format's eight-byte magic and 14-byte record around a scalar
  put 96 bytes more on the wire per 2-rank job (its Exec in and out of the broker, its
  Dones, its result), each byte boxed and opened once more. Nothing that binds a box is
  shorter: its tag, nonce, epoch and associated data are as they were, and the plaintext
  is authenticated before either form is read. A box of the first format is refused.
* **Numbered.** A payload :meth:`Sealer.seal` makes carries its epoch's next number, bound
  like the rest: a box's nonce, or a record's salt (the epoch's first half, then the
  number). An epoch's first half is its start time (the sealer's clock, above the floor its
  recipient gave: ``mpl.wire.replay.epoch_start``), its second half random. A worker keeps
  a window of the numbers of the Execs it ran per sender and epoch, and a floor of the
  epochs it forgot (``mpl.wire.replay``); an Exec's context names the recipient worker's
  process (its public incarnation), so a broker cannot replay a recorded job however long
  it waits, nor after the worker restarted.
* **None as a tag alone.** A sealed None (the bindings of every rank a job gives no inputs,
  sealed on every such job) has nothing to hide, only a sender, a recipient and a context
  to prove: it is a box whose ciphertext is replaced by a 16-byte prefix-keyed BLAKE2b tag over
  its nonce and context, under a second key of the same epoch (personalised apart from the
  cipher's). One hash call instead of a cipher set-up, encode and decode on either side; it
  is bound exactly as a box is (a box's ciphertext is never empty: its plaintext holds at
  least one byte, so the two cannot be taken for one another). A job whose ranks
  have no inputs gets all its Nones from one call (:meth:`Sealer.seal_nones`), each still
  tagged under its own recipient's epoch.

Opening is all-or-nothing: anything wrong raises :class:`AuthenticationError` before the
plaintext is decoded, so a pickle inside a job's bindings or program is loaded only after
the driver that sealed it has been proved to be one the worker's own spec lists.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import struct
import weakref
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from zmq.utils import z85

from mpl.wire.codec import MAGIC_FRAME, ZERO_COPY_BYTES, encode
from mpl.wire.curve import Curve
from mpl.wire.errors import AuthenticationError
from mpl.wire.identity import driver_identity, node_identity
from mpl.wire.replay import epoch_start, epoch_time
from mpl.wire.seal_box import (
    _LENGTHS,
    _ONE_BYTE,
    _RUN_SHIFT,
    RUN,
    BoxKeys,
    box_open,
    box_seal,
    epoch_keys,
    run_pads,
)
from mpl.wire.seal_contexts import (
    ExecTails,
    done_context,
    exec_context,
    fetch_context,
    incarnation_suffix,
    pin_contexts,
    program_context,
)
from mpl.wire.seal_payload import (
    NOT_ONE_BYTE,
    RAW_FIXINT,
    RAW_ONE_BYTE,
    Payload,
    box_value,
    payload_value,
    raw_scalar,
    scalar_frames,
)
from mpl.wire.seal_record import CHUNK, SALT, check_record, layout, open_record, seal_record
from mpl.wire.sealed import BOX_MAGIC, Sealed, malformed_box

__all__ = [
    "CHUNK",
    "COMPACT_MAX",
    "ExecTails",
    "Sealed",
    "Sealer",
    "done_context",
    "exec_context",
    "fetch_context",
    "incarnation_suffix",
    "pin_contexts",
    "program_context",
]

_SALT = SALT  # a record's salt, and a compact box's epoch
_TAG = 16  # a compact box's tag (and a sealed None's)
_INFO = b"mpl-seal/1"
# A compact box stays well below the codec's copy threshold, so it travels inside the
# message header as bytes (never as a buffer frame, which would arrive as another type).
COMPACT_MAX = ZERO_COPY_BYTES // 2
_NONCE = 12
_EPOCHS_KEPT = 1024  # ciphers of other processes' epochs a recipient keeps
_BOX_START = len(BOX_MAGIC) + 1  # where a box's sender identity starts
_BOX_HEAD = _BOX_START + _SALT  # a box's head (magic, sender, epoch) but for the identity
_BOX_TRAILER = _NONCE + _TAG  # the least a box holds after its head


# A forked child would otherwise go on with its parent's epochs and counters and seal boxes
# under (key, nonce) pairs its parent also uses: it draws new epochs instead.
_SEALERS: weakref.WeakSet[Sealer] = weakref.WeakSet()


def _forget_epochs_in_child() -> None:
    for sealer in list(_SEALERS):
        sealer._sending.clear()


os.register_at_fork(after_in_child=_forget_epochs_in_child)


# an epoch a process seals under: box head, box ciphers, None's keyed tag hash, box counter
_Epoch = tuple[bytes, BoxKeys, hashlib.blake2b, "itertools.count[int]"]


# a box's nonce: its epoch's counter, 12 bytes big-endian (a counter never reaches 2**64)
_box_nonce = struct.Struct(">4xQ").pack


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
        me = identity.encode()
        # what starts every compact box this process seals (None: a name too long for it)
        self._box_head = BOX_MAGIC + bytes([len(me)]) + me if len(me) < 256 else None
        self.compact = self._box_head is not None  # whether it seals compact boxes at all
        # recipient -> (box head with this process's epoch for it, its cipher, its None's
        # keyed tag hash, box counter)
        self._sending: dict[str, _Epoch] = {}
        # recipient -> the floor it set for this sealer's epochs (``renew``): new ones start
        # above it
        self.floors: dict[str, int] = {}
        # a box's head (magic, sender, epoch) -> (sender, cipher, tag hash), oldest
        # first; a plain dict: a driver opens on its pump thread and its caller's thread at
        # once, and each dict operation is atomic
        self._receiving: dict[bytes, tuple[str, BoxKeys, hashlib.blake2b]] = {}
        _SEALERS.add(self)

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
    def seal(self, value: Any, to: str, context: str, safe: bool = True) -> Sealed | bytes:
        """Seal ``value`` for ``to`` (an identity among this sealer's peers).

        ``safe`` refuses values outside the safe value format at once (what a worker sends
        a driver); a driver sealing functions for a worker passes ``safe=False``. A small
        value comes back as a compact box (``bytes``), anything else as a ``Sealed``.
        """
        if value is None and self._box_head is not None:
            head, _, mark, counter = self._sending.get(to) or self._new_epoch(to)
            nonce = _box_nonce(next(counter))
            # the tag: prefix-keyed BLAKE2b over nonce and context, from the epoch's state
            tagger = mark.copy()
            tagger.update(nonce + context.encode())
            return head + nonce + tagger.digest()
        if self._box_head is not None:
            # a small scalar's plaintext is its msgpack bytes alone (seal_payload.raw_scalar)
            if type(value) is int and -32 <= value < 128:  # the commonest result: no call
                plain: bytes | None = RAW_FIXINT[value]
            else:
                plain = raw_scalar(value)
            if plain is None:
                frames = encode(Payload(value), safe=safe)
                if len(frames) == 2 and len(frames[1]) < COMPACT_MAX:
                    plain = frames[1]
            if plain is not None:
                head, keys, _, counter = self._sending.get(to) or self._new_epoch(to)
                nonce = _box_nonce(next(counter))
                aad = context.encode() + _COMPACT_AAD
                return b"".join((head, nonce, box_seal(keys, nonce, plain, aad)))
        else:
            frames = scalar_frames(value) or encode(Payload(value), safe=safe)
        # numbered as boxes are (a worker refuses an Exec's bindings run before by number):
        # the epoch's first half, then the epoch's next number
        head, _, _, counter = self._sending.get(to) or self._new_epoch(to)
        salt = head[-_SALT : -_SALT // 2] + next(counter).to_bytes(_SALT // 2, "big")
        return self._record(frames, salt, to, context)

    def seal_scalars(self, values: dict[int, Any], to: str, prefix: str) -> dict[int, bytes] | None:
        """``{index: seal(value, to, prefix + str(index))}`` for the values of one answer (a
        Done's outputs) when every one is a small scalar (None, a bool, a 64-bit int, a
        float, a short str: the boxes are the bytes :meth:`seal` makes), in one call: the
        recipient's epoch is looked up once and no value goes through the codec. None for
        anything else (no box kept: the caller seals the values as usual; a few small boxes
        may have been made and dropped, their numbers never reused)."""
        if self._box_head is None:  # records only
            return None
        head, keys, mark, counter = self._sending.get(to) or self._new_epoch(to)
        start = prefix.encode()  # the contexts' common part, encoded once
        out: dict[int, bytes] = {}
        for index, value in values.items():
            if type(value) is int and -32 <= value < 128:  # the commonest result: no call
                # box_seal of its one byte (RAW_FIXINT[value], a fixint: value's low byte)
                # written out, the box joined once: its byte of its nonce's run of pads
                # (hashed once per 64 boxes: run_pads), then its tag over nonce, length,
                # ciphertext and associated data (the context, then what follows)
                seq = next(counter)
                nonce = _box_nonce(seq)
                run, pads = keys[3][0]
                if seq >> 6 != run:  # (box_seal's _RUN_SHIFT: pinned below)
                    pads = run_pads(keys, seq >> 6)
                hidden = _ONE_BYTE[(value & 0xFF) ^ pads[seq & 63]]
                tag = keys[1].copy()
                tail = (
                    _INDEX_AADS[index]
                    if 0 <= index < _INDEXES
                    else f"{index}".encode() + _COMPACT_AAD
                )
                tag.update(b"".join((nonce, _LENGTH_ONE, hidden, start, tail)))
                out[index] = b"".join((head, nonce, hidden, tag.digest()))
                continue
            if value is None:  # a tag alone, as seal() makes it
                nonce = _box_nonce(next(counter))
                tagger = mark.copy()
                tagger.update(b"".join((nonce, start, str(index).encode())))
                out[index] = head + nonce + tagger.digest()
                continue
            plain = raw_scalar(value)
            if plain is None:
                return None
            nonce = _box_nonce(next(counter))
            # the context and what follows it (the commonest outputs' written once)
            aad = start + (
                _INDEX_AADS[index] if 0 <= index < _INDEXES else f"{index}".encode() + _COMPACT_AAD
            )
            out[index] = b"".join((head, nonce, box_seal(keys, nonce, plain, aad)))
        return out

    def seal_nones(
        self, targets: dict[int, tuple[str, bytes]], ranks: tuple[int, ...], context: bytes
    ) -> dict[int, Any]:
        """``{rank: seal(None, who, context + suffix)}``, ``(who, suffix) = targets[rank]``
        (its recipient, and what ends its context, encoded: b"" when all ranks' are one),
        for every rank of ``ranks`` in one call (a job whose ranks have no inputs: most
        jobs), the job's context given encoded (UTF-8): each tag still under the epoch of
        its own recipient, numbered by that epoch's counter, over its own rank's context.
        KeyError (the rank) for a rank ``targets`` has no entry for."""
        if self._box_head is None:  # records only: seal() says how
            return {
                r: self.seal(None, targets[r][0], (context + targets[r][1]).decode()) for r in ranks
            }
        sending, out = self._sending, {}
        for rank in ranks:
            who, suffix = targets[rank]
            head, _, mark, counter = sending.get(who) or self._new_epoch(who)
            nonce = _box_nonce(next(counter))
            tagger = mark.copy()  # as seal() makes a None's tag
            tagger.update(nonce + context + suffix)
            out[rank] = head + nonce + tagger.digest()
        return out

    def _new_epoch(self, to: str) -> _Epoch:
        # its first half the clock, above the recipient's floor (mpl.wire.replay)
        epoch = epoch_start(self.floors.get(to, -1)) + os.urandom(_SALT // 2)
        keys, mark = self._epoch_keys(to, epoch, self.identity, to)
        head = (self._box_head or b"") + epoch  # no boxes without a box head: records only
        sending = self._sending[to] = (head, keys, mark, itertools.count())
        return sending

    def stream(self, to: str) -> bytes | None:
        """The stream this sealer seals for ``to`` under now (its epoch's first half, as
        ``mpl.wire.replay.claimed_stream`` reads it from a payload); None before its first
        payload for ``to`` or after :meth:`renew`."""
        sending = self._sending.get(to)
        return sending[0][-_SALT : -_SALT // 2] if sending is not None else None

    def renew(self, to: str, numbered: int, floor: int = -1) -> bool:
        """Seal for ``to`` under a new epoch from now on (its numbers start again at 0), if
        the current one has numbered at least ``numbered`` payloads, or its time is at or
        below ``floor`` (``to``'s floor for this sealer's streams: every later epoch for it
        starts above; -1: none); whether it did."""
        if floor > self.floors.get(to, -1):
            self.floors[to] = floor
        sending = self._sending.get(to)
        if sending is None:
            return False
        # the numbers drawn so far, read by drawing one: the payload that would have taken it
        # skips it (a gap the recipient's replay window takes as numbers not yet run)
        if epoch_time(sending[0][-_SALT:]) > floor and next(sending[3]) < numbered:
            return False
        self._sending.pop(to, None)  # the next seal draws the new epoch
        return True

    def seal_record(self, value: Any, to: str, context: str, *, safe: bool = True) -> Sealed:
        """:meth:`seal`, always as a ``Sealed`` record (what a ``Program`` carries)."""
        return self._record(encode(Payload(value), safe=safe), os.urandom(_SALT), to, context)

    def _record(self, frames: list[Any], salt: bytes, to: str, context: str) -> Sealed:
        pair = self._pair_key(to, self.identity, to)
        return seal_record(pair, self.identity, salt, context, frames)

    # -- opening --------------------------------------------------------------------------
    def open(
        self,
        sealed: Any,
        context: str,
        *,
        sender: str = "",
        safe: bool = True,
        unpickle: bool = True,
    ) -> Any:
        """Open a payload (a ``Sealed`` or a compact box) sealed for this process;
        ``(sealer identity, value)``.

        ``sender``, when given, is the only identity allowed to have sealed it (the rank a
        result must come from). Raises :class:`AuthenticationError` for anything not sealed
        by a peer this spec lists for exactly this context, and decodes the plaintext only
        then (``safe`` and ``unpickle`` as in :func:`mpl.wire.codec.decode`).
        """
        if type(sealed) is bytes:
            return self.open_box(sealed, context, sender, safe, unpickle)
        if type(sealed) is not Sealed:
            raise AuthenticationError(
                f"expected a sealed payload ({context.split('|')[0]}), got "
                f"{type(sealed).__name__}: secure mode seals everything between a driver "
                "and a worker"
            )
        who = sealed.sender
        self._check_sender(who, sender)
        check_record(sealed)  # its layout, before any key is made (mpl.wire.seal_record)
        try:
            header, bufs = open_record(self._pair_key(who, who, self.identity), sealed, context)
        except InvalidTag:
            raise _failed(who, context) from None
        return who, payload_value(who, [MAGIC_FRAME, header, *bufs], safe, unpickle)

    def open_box(self, box: bytes, context: str, sender: str, safe: bool, unpickle: bool) -> Any:
        """:meth:`open` for a compact box: the same checks, in the same order. A hot path
        that holds ``bytes`` calls it directly (one Python call less per payload); any
        ``bytes`` may come here, a malformed one raises :class:`AuthenticationError`.

        A box's head (magic, sender, epoch) is the same for every box of one sealing
        process's epoch: once one of them has authenticated, the head alone finds its sender
        and cipher, and only the sender check (``sender``) is left to make before the tag
        is checked."""
        size = len(box)
        end = box[_BOX_START - 1] + _BOX_HEAD if size >= _BOX_START else _BOX_HEAD  # epoch's end
        if size < end + _BOX_TRAILER:
            raise AuthenticationError("malformed sealed payload")
        head = box[:end]
        known = self._receiving.get(head)
        if known is not None:
            who, keys, mark = known
            if sender and who != sender:
                raise AuthenticationError(f"a payload from {sender} claims to be sealed by {who}")
        else:
            if not head.startswith(BOX_MAGIC):
                raise AuthenticationError(malformed_box(head))
            try:
                who = head[_BOX_START : end - _SALT].decode()
            except UnicodeDecodeError:
                raise AuthenticationError("malformed sealed payload") from None
            self._check_sender(who, sender)
            keys, mark = self._epoch_keys(who, head[end - _SALT :], who, self.identity)
        nonce = box[end : end + _NONCE]
        if size == end + _BOX_TRAILER:  # no ciphertext: a sealed None's tag alone
            tagger = mark.copy()  # as seal() makes it: over its key, nonce and context
            tagger.update(nonce + context.encode())
            if not hmac.compare_digest(box[end + _NONCE :], tagger.digest()):
                raise _failed(who, context)
            header = None
        else:
            try:
                header = box_open(keys, nonce, box[end + _NONCE :], context.encode() + _COMPACT_AAD)
            except InvalidTag:
                raise _failed(who, context) from None
        if known is None:  # kept only once authenticated: forged epochs cannot flush it
            if len(self._receiving) >= _EPOCHS_KEPT:
                try:
                    oldest = next(iter(self._receiving))
                except (StopIteration, RuntimeError):  # another thread changed it just now
                    oldest = None
                if oldest is not None:
                    self._receiving.pop(oldest, None)
            self._receiving[head] = (who, keys, mark)
        if header is None:
            return who, None
        value = RAW_ONE_BYTE.get(header, NOT_ONE_BYTE)  # None, bools, small ints
        if value is not NOT_ONE_BYTE:
            return who, value
        return who, box_value(who, header, safe, unpickle)

    def opened_epoch(self, head: bytes) -> tuple[str, BoxKeys, hashlib.blake2b] | None:
        """``(sender, box ciphers, None's tag hash)`` of a box head (magic, sender, epoch) whose
        box has authenticated here (:meth:`open_box` keeps them), or None: for a hot path
        that checks a sealed None's tag itself, as :meth:`open_box` does."""
        return self._receiving.get(head)

    def _check_sender(self, who: str, sender: str) -> None:
        if sender and who != sender:
            raise AuthenticationError(f"a payload from {sender} claims to be sealed by {who}")
        if who not in self._peers:
            raise AuthenticationError(
                f"a payload claims to be sealed by {who!r}, which this process's cluster spec "
                "does not list"
            )

    def _epoch_keys(
        self, peer: str, epoch: bytes, sender: str, recipient: str
    ) -> tuple[BoxKeys, hashlib.blake2b]:
        """The ciphers of one sealing process's epoch for one direction (its compact
        boxes', ``mpl.wire.seal_box``), and the keyed hash of its sealed Nones' tags."""
        return epoch_keys(self._pair_key(peer, sender, recipient), epoch)

    def _pair_key(self, peer: str, sender: str, recipient: str) -> bytes:
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
        return pair


# A compact box holds a payload with no buffers: its header is piece 0 of a one-piece
# layout, as in a ``Sealed`` with no buffers (after the context, in the associated data).
# Its format's magic ends it: a box is authenticated as of its format.
_COMPACT_AAD = b"|0" + layout(1, []) + BOX_MAGIC
# the end of an answer's associated data after its prefix, by output index (the commonest)
_INDEXES = 16
_INDEX_AADS = tuple(f"{index}".encode() + _COMPACT_AAD for index in range(_INDEXES))
_LENGTH_ONE = _LENGTHS[1]  # a one-byte plaintext's length, as a box's tag input holds it
# seal_scalars seals a small int's msgpack fixint as its low byte: pinned here
if any(RAW_FIXINT[value] != _ONE_BYTE[value & 0xFF] for value in RAW_FIXINT):
    raise ImportError("mpl.wire.seal seals small ints unlike their msgpack bytes")
# seal_scalars and mpl.wire.result_open find a nonce's run and byte as (n >> 6, n & 63)
if RUN != 64 or _RUN_SHIFT != 6:
    raise ImportError("mpl.wire.seal finds one-byte pads unlike mpl.wire.seal_box")


def _failed(who: str, context: str) -> AuthenticationError:
    return AuthenticationError(
        f"a payload sealed by {who} failed authentication ({context.split('|')[0]}): "
        "it was altered, or replayed from another job, request or party"
    )
