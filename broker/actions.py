"""What the broker's decision logic asks its ZeroMQ shell to do: send a message to a peer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from mpl.wire.record import Record

__all__ = ["Send", "fan"]


class Send(NamedTuple):
    """Send ``msg`` to the peer with routing identity ``peer``.

    ``raw``, when given, holds the frames ``msg`` arrived in: the shell forwards them as they
    are instead of encoding ``msg`` again. A tuple: the broker makes several per message.
    """

    peer: bytes
    msg: Record
    raw: Any = None


_new = tuple.__new__


def fan(peers: Iterable[bytes], msg: Record, raw: Any = None) -> list[Send]:
    """``[Send(peer, msg, raw) for peer in peers]`` without a Python call per peer (the
    NamedTuple's ``__new__`` is one): an Exec that goes out the same to every rank."""
    return [_new(Send, (peer, msg, raw)) for peer in peers]
