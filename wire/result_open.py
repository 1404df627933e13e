"""A driver's opening of a job's inline values (secure mode): every output of every rank in
one call per answer.

A result's values come as ``{output: {rank: sealed value}}``, each sealed by its rank's
node for this driver under ``done|session|job|output`` (``mpl.wire.seal_contexts``). Most
are compact boxes of an epoch the driver has opened a box of before (a worker keeps its
epoch for this driver): for those the cipher is found by the box's head, as
:meth:`Sealer.open_box` finds it, and the box is opened here with the same checks in the
same order (the head's sender must be the rank's node, then the tag). Anything else (a
first box of an epoch, a sealed None, a record with buffers, something malformed) goes to
:meth:`Sealer.open`, which says why it does not open.

One opener per session (:func:`result_opener`): the context's session part is written
once, each answer's associated data once per output (one string, encoded once), each
rank's box cut by slices made once per epoch, the values opened in place (in the dicts the
answer was decoded into: no dict built per answer), and the answer costs one Python call.
"""

from __future__ import annotations

from collections.abc import Callable
from hmac import compare_digest
from typing import Any

from cryptography.exceptions import InvalidTag

from mpl.wire.seal import (
    _BOX_HEAD,
    _BOX_START,
    _COMPACT_AAD,
    _NONCE,
    _TAG,
    Sealer,
    _failed,
)
from mpl.wire.seal_box import _LENGTHS, _ONE_BYTE, ETM_MAX, BoxKeys, box_open, run_pads
from mpl.wire.seal_contexts import done_context
from mpl.wire.seal_payload import NOT_ONE_BYTE, RAW_ONE_BYTE, box_value

__all__ = ["Opener", "result_opener"]

# (job, {output: {rank: sealed}}) -> {output: {rank: value}}
Opener = Callable[[str, dict[int, dict[int, Any]]], dict[int, dict[int, Any]]]

# what follows an output's index in a compact box's associated data, as text
_AAD_TAIL = _COMPACT_AAD.decode()
_LEN_AT = _BOX_START - 1  # where a box's sender length byte is
_TAILS = tuple(f"|{index}{_AAD_TAIL}" for index in range(16))  # the commonest indexes

# a one-byte plaintext's value by its byte (NOT_ONE_BYTE: read by box_value)
_ONE_BYTE_VALUES = tuple(RAW_ONE_BYTE.get(b, NOT_ONE_BYTE) for b in _ONE_BYTE)
# a one-byte ciphertext as a box's tag input holds it after the nonce: its length, then it
_ONE_BYTE_TAGGED = tuple(_LENGTHS[1] + b for b in _ONE_BYTE)

# a nonce's number (big-endian): the bound classmethod made once, not looked up per box
_number = int.from_bytes

if done_context("s", "j", 3) != "done|s|j|3":  # written out below, as done_context writes it
    raise ImportError("mpl.wire.result_open writes Done contexts unlike mpl.wire.seal")


def result_opener(
    sealer: Sealer,
    senders: dict[int, str],
    session: str,
    safe: bool,
    unknown: Callable[[int], str],
) -> Opener:
    """What opens the values of session ``session``'s results, in place: each only if the
    node of its rank (``senders``: rank -> identity, read at every answer) sealed it for
    this sealer, for exactly that job and output; decoded as ``decode(..., safe=safe)``.
    The opener replaces each sealed value by its value in the dicts it is given and returns
    the outer one (what it is given is the caller's own: an answer decoded for this call).
    For a rank ``senders`` has no identity for, ``unknown(rank)`` raises (or names its
    sender). Raises :class:`~mpl.wire.errors.AuthenticationError` as :meth:`Sealer.open`
    does (then the dicts may hold some values opened, some not)."""
    prefix = f"done|{session}|"
    receiving = sealer._receiving  # the ciphers of epochs that authenticated (open_box)
    open_any = sealer.open
    # rank -> (where its head is, the head, box ciphers, sender, where its nonce is, where its
    # ciphertext is) of the epoch its node's last box opened under, once authenticated: a
    # box with that head is that epoch's (one per rank: bounded)
    heads: dict[int, tuple[slice, bytes, BoxKeys, str, slice, int]] = {}

    def opened(job: str, sealed: dict[int, dict[int, Any]]) -> dict[int, dict[int, Any]]:
        for index, per_rank in sealed.items():
            tail = _TAILS[index] if 0 <= index < 16 else f"|{index}{_AAD_TAIL}"
            aad = f"{prefix}{job}{tail}".encode()
            for rank, box in per_rank.items():
                # the epoch its rank's node's last box opened under, from that node: a box
                # of its head, from that node, holding a ciphertext (not a None's tag alone)
                try:
                    cut, head, keys, who, nonce, at = heads[rank]
                    size = len(box) - at - _TAG if type(box) is bytes else 0
                    known = size > 0 and box[cut] == head and who is senders[rank]
                except KeyError:
                    known = False
                if known:
                    # box_open written out for a box of at most ETM_MAX bytes of
                    # plaintext (a Python call less per rank): its tag checked before
                    # its pad is made
                    if size == 1:  # None, a bool, a small int (most answers)
                        iv = box[nonce]
                        mac = keys[1].copy()
                        mac.update(b"".join((iv, _ONE_BYTE_TAGGED[box[at]], aad)))
                        if not compare_digest(box[at + 1 :], mac.digest()):
                            raise _failed(who, f"{prefix}{job}|{index}")
                        # its byte of its nonce's run of pads (the epoch's last run kept:
                        # hashed once per 64 boxes, run_pads), as box_open takes it
                        seq = _number(iv)
                        run, pads = keys[3][0]
                        if seq >> 6 != run:  # (pinned in mpl.wire.seal)
                            pads = run_pads(keys, seq >> 6)
                        byte = box[at] ^ pads[seq & 63]
                        value = _ONE_BYTE_VALUES[byte]
                        if value is NOT_ONE_BYTE:  # a one-byte header the codec reads
                            value = box_value(who, _ONE_BYTE[byte], safe, True)
                        per_rank[rank] = value
                        continue
                    if size <= ETM_MAX:
                        iv = box[nonce]
                        hidden = box[at : at + size]
                        mac = keys[1].copy()
                        mac.update(b"".join((iv, _LENGTHS[size], hidden, aad)))
                        if not compare_digest(box[at + size :], mac.digest()):
                            raise _failed(who, f"{prefix}{job}|{index}")
                        pad = keys[0].copy()
                        pad.update(iv)
                        mask = int.from_bytes(pad.digest()[:size])
                        header = (int.from_bytes(hidden) ^ mask).to_bytes(size)
                    else:
                        try:
                            header = box_open(keys, box[nonce], box[at:], aad)
                        except InvalidTag:
                            raise _failed(who, f"{prefix}{job}|{index}") from None
                    value = box_value(who, header, safe, True)  # (two bytes or more)
                    per_rank[rank] = value
                    continue
                try:
                    who = senders[rank]
                except KeyError:
                    who = unknown(rank)
                # open_box says why, or learns the epoch; a record: open
                per_rank[rank] = open_any(box, f"{prefix}{job}|{index}", sender=who, safe=safe)[1]
                if type(box) is bytes:  # opened: its epoch authenticated, from ``who``
                    end = box[_LEN_AT] + _BOX_HEAD  # the head's end: the nonce follows
                    epoch = receiving.get(box[:end])
                    if epoch is not None and epoch[0] == who:
                        at = end + _NONCE  # the ciphertext's start
                        heads[rank] = (
                            slice(0, end),
                            box[:end],
                            epoch[1],
                            who,
                            slice(end, at),
                            at,
                        )
        return sealed

    return opened
