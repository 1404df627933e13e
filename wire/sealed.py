"""What the broker sees of a payload between a driver and a worker in secure mode: a
``Sealed`` record, or, for a small payload (no buffer frames: a job's bindings, an inline
result), one ``bytes`` string starting with :data:`BOX_MAGIC`, which the broker and the
codec carry as plain bytes without any record to build. Sealing and opening live in
``mpl.wire.seal`` (which needs the ``cryptography`` package); this module alone is what
every process must know to route or recognise one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpl.wire.record import Record

__all__ = ["BOX_MAGIC", "Sealed", "is_sealed", "malformed_box"]

# A compact box: BOX_MAGIC, the sender identity's length (one byte) and UTF-8 bytes, the
# sender's 16-byte epoch, the 12-byte nonce (the epoch's counter), then the ciphertext of its
# plaintext (a small scalar's msgpack bytes, or the codec header) with its 16-byte tag (or,
# for a sealed None, a 16-byte tag alone). Three bytes of magic, the last the box format's
# version: every byte of a box is paid for again by CurveZMQ at both ends of every hop. The
# version is authenticated (in every box's associated data and every key's derivation), and
# earlier formats are refused: the first (magic b"mpl-box\x01", a scalar inside the codec's
# record) and the second (b"MB\x02", every box under AES-256-GCM, its magic not
# authenticated; the third (b"MB\x03") sealed a box of at most 64 bytes by keyed BLAKE2b, the
# fourth (b"MB\x04") by BLAKE2b keyed by a prefix, one compression where keyed BLAKE2b takes
# two, with a pad hashed per box; the fifth (this one) takes a one-byte plaintext's pad from
# a run of 64 nonces' pads hashed once (mpl.wire.seal_box).
BOX_MAGIC = b"MB\x05"


@dataclass(eq=False, repr=False)
class Sealed(Record, tag="sealed"):
    """One payload sealed for one recipient. ``sender`` is a claim: the recipient looks the
    key up in its own spec, and only that key's holder could have sealed what opens."""

    sender: str
    salt: bytes  # 16 bytes, unique per payload (Sealer.seal: its epoch's half and number)
    sizes: list[int]  # plaintext bytes of each codec buffer frame
    parts: list[Any]  # ciphertext: the codec header, then each buffer in CHUNK pieces


def is_sealed(value: Any) -> bool:
    """Whether ``value`` is a sealed payload in either form (a record or a compact box)."""
    return type(value) is Sealed or (type(value) is bytes and value.startswith(BOX_MAGIC))


def malformed_box(box: bytes) -> str:
    """Why a box that does not start with :data:`BOX_MAGIC` is refused: a box of an earlier
    format is named as one (a driver and its workers run different versions of mpl)."""
    if len(box) > 2 and box[:2] == BOX_MAGIC[:2] and 0 < box[2] < BOX_MAGIC[2]:
        return (
            f"malformed sealed payload: a box of format {box[2]}, where this process reads "
            f"format {BOX_MAGIC[2]} only (drivers and workers must run the same mpl version)"
        )
    return "malformed sealed payload"
