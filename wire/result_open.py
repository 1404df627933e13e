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
once, each answer's associated data once per output (one string, encoded once), and the
answer costs one Python call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cryptography.exceptions import InvalidTag

from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.seal import (
    _BOX_HEAD,
    _BOX_START,
    _BOX_TRAILER,
    _COMPACT_AAD,
    _NONCE,
    Sealer,
    _failed,
    _value,
)
from mpl.wire.seal_contexts import done_context
from mpl.wire.seal_payload import NOT_ONE_BYTE, ONE_BYTE_VALUES

__all__ = ["Opener", "result_opener"]

# (job, {output: {rank: sealed}}) -> {output: {rank: value}}
Opener = Callable[[str, dict[int, dict[int, Any]]], dict[int, dict[int, Any]]]

# what follows an output's index in a compact box's associated data, as text
_AAD_TAIL = _COMPACT_AAD.decode()
_LEN_AT = _BOX_START - 1  # where a box's sender length byte is
_TAILS = tuple(f"|{index}{_AAD_TAIL}" for index in range(16))  # the commonest indexes

if done_context("s", "j", 3) != "done|s|j|3":  # written out below, as done_context writes it
    raise ImportError("mpl.wire.result_open writes Done contexts unlike mpl.wire.seal")


def result_opener(
    sealer: Sealer,
    senders: dict[int, str],
    session: str,
    safe: bool,
    unknown: Callable[[int], str],
) -> Opener:
    """What opens the values of session ``session``'s results: each only if the node of
    its rank (``senders``: rank -> identity, read at every answer) sealed it for this
    sealer, for exactly that job and output; decoded as ``decode(..., safe=safe)``. For a
    rank ``senders`` has no identity for, ``unknown(rank)`` raises (or names its sender).
    Raises :class:`~mpl.wire.errors.AuthenticationError` as :meth:`Sealer.open` does."""
    prefix = f"done|{session}|"
    receiving = sealer._receiving  # the ciphers of epochs that authenticated (open_box)
    open_any = sealer.open
    # rank -> (its length, head, cipher) of the epoch its node's last box opened under,
    # once authenticated: a box with that head is that epoch's (one per rank: bounded)
    heads: dict[int, tuple[int, bytes, Any, str]] = {}

    def opened(job: str, sealed: dict[int, dict[int, Any]]) -> dict[int, dict[int, Any]]:
        values: dict[int, dict[int, Any]] = {}
        for index, per_rank in sealed.items():
            tail = _TAILS[index] if 0 <= index < 16 else f"|{index}{_AAD_TAIL}"
            aad = f"{prefix}{job}{tail}".encode()
            out: dict[int, Any] = {}
            for rank, box in per_rank.items():
                try:  # the epoch its rank's node's last box opened under, from that node
                    end, head, aead, who = heads[rank]
                    if who is not senders[rank]:
                        end = 0
                except KeyError:
                    end = 0
                if (
                    end
                    and type(box) is bytes
                    and box[:end] == head
                    and len(box) > end + _BOX_TRAILER  # a ciphertext, not a None's tag
                ):
                    try:
                        header = aead.decrypt(box[end : end + _NONCE], box[end + _NONCE :], aad)
                    except InvalidTag:
                        raise _failed(senders[rank], f"{prefix}{job}|{index}") from None
                    value = ONE_BYTE_VALUES.get(header, NOT_ONE_BYTE)  # None, bools, ints
                    if value is NOT_ONE_BYTE:
                        value = _value(senders[rank], [MAGIC_FRAME, header], safe, True)
                    out[rank] = value
                    continue
                try:
                    who = senders[rank]
                except KeyError:
                    who = unknown(rank)
                # open_box says why, or learns the epoch; a record: open
                out[rank] = open_any(box, f"{prefix}{job}|{index}", sender=who, safe=safe)[1]
                if type(box) is bytes:  # opened: its epoch authenticated, from ``who``
                    end = box[_LEN_AT] + _BOX_HEAD
                    known = receiving.get(box[:end])
                    if known is not None and known[0] == who:
                        heads[rank] = (end, box[:end], known[1], who)
            values[index] = out
        return values

    return opened
