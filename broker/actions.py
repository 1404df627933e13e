"""What the broker's decision logic asks its ZeroMQ shell to do: send a message to a peer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpl.wire.record import Record

__all__ = ["Send"]


@dataclass(frozen=True)
class Send:
    """Send ``msg`` to the peer with routing identity ``peer``.

    ``raw``, when given, holds the frames ``msg`` arrived in: the shell forwards them as they
    are instead of encoding ``msg`` again.
    """

    peer: bytes
    msg: Record
    raw: Any = None
