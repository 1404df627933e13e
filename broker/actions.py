"""What the broker's decision logic asks its ZeroMQ shell to do: send a message to a peer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from mpl.wire.jobs import Exec
from mpl.wire.record import Record, pinned_fields

__all__ = ["Send", "box_execs", "fan", "own_execs"]


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


def box_execs(peers: Sequence[bytes], msg: Exec, raw: Sequence[Any]) -> list[Send]:
    """A sealed Exec (``mpl.wire.sealed_exec``: ``raw`` is its magic, its header, then each
    rank's box as they came, checked, in the order of ``msg.ranks``) to each rank of its
    job, ``peers`` in that order: the magic, then the header joined to that rank's box.
    Joined only here, once the job's ranks were checked against the cluster (so a sender
    cannot have the header copied for ranks that do not exist); no header is cut or
    encoded per rank, and no Python call is made per rank."""
    magic, head, out = raw[0], raw[1], []
    for peer, box in zip(peers, raw[2:], strict=True):  # a loop: a comprehension is a call
        out.append(_new(Send, (peer, msg, [magic, head + box])))
    return out


# own_execs fills each rank's Exec in directly (record.replaced without its calls)
_EXEC_FIELDS = pinned_fields(
    Exec,
    ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s"),
    "mpl.broker.actions",
    direct=True,
)
_new_record = object.__new__


def own_execs(
    peers: Sequence[bytes], msg: Exec, frames: Sequence[list[bytes]] | None
) -> list[Send]:
    """The Exec ``msg`` (decoded, so checked) to each rank of its job, ``peers`` in the order
    of ``msg.ranks``: each with that rank's bindings only (none if it has none), and
    ``frames[i]`` (``mpl.wire.hot_spans.execs_for_ranks``) if given, else encoded anew;
    without a Python call per rank (in secure mode every rank has its own)."""
    fields, bindings = msg.__dict__, msg.bindings
    if len(fields) != len(_EXEC_FIELDS):  # values cached from the fields: never copied
        fields = {name: fields[name] for name in _EXEC_FIELDS}
    out: list[Send] = []
    for at, rank in enumerate(msg.ranks):
        forwarded = _new_record(Exec)
        mine = {rank: bindings[rank]} if rank in bindings else {}
        forwarded.__dict__.update(fields, bindings=mine)
        out.append(_new(Send, (peers[at], forwarded, None if frames is None else frames[at])))
    return out
