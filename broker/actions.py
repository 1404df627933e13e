"""What the broker's decision logic asks its ZeroMQ shell to do: send a message to a peer."""

from __future__ import annotations

from typing import Any, NamedTuple

from mpl.wire.record import Record

__all__ = ["Send"]


class Send(NamedTuple):
    """Send ``msg`` to the peer with routing identity ``peer``.

    ``raw``, when given, holds the frames ``msg`` arrived in: the shell forwards them as they
    are instead of encoding ``msg`` again. A tuple: the broker makes several per message.
    """

    peer: bytes
    msg: Record
    raw: Any = None
