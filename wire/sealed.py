"""The sealed payload record: what the broker sees of a payload between a driver and a
worker in secure mode. Sealing and opening live in ``mpl.wire.seal`` (which needs the
``cryptography`` package); this record alone is what every process must know to route one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpl.wire.record import Record

__all__ = ["Sealed"]


@dataclass(eq=False, repr=False)
class Sealed(Record, tag="sealed"):
    """One payload sealed for one recipient. ``sender`` is a claim: the recipient looks the
    key up in its own spec, and only that key's holder could have sealed what opens."""

    sender: str
    salt: bytes
    sizes: list[int]  # plaintext bytes of each codec buffer frame
    parts: list[Any]  # ciphertext: the codec header, then each buffer in CHUNK pieces
