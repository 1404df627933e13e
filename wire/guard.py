"""Containment: the failure of one message stays the failure of that one message.

Every daemon loop (broker, worker I/O thread) hands each message to its handler inside a
guard. Whatever escapes, from decoding, checking, handling or encoding, is counted
(``protocol_errors`` for input that is bad, ``internal_errors`` for a handler or an encoder
that failed on input that decoded), logged once with the peer it came from, and answered
with an error when the sender waits for an answer. Then the loop goes on with the next
message: no message can stop a daemon.
"""

from __future__ import annotations

import logging

from mpl.wire.data import Fetch
from mpl.wire.errors import MplError
from mpl.wire.jobs import Done, Exec, Failed, JobResult
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import Ack, DeleteSymbol, Reply, SaveSymbol

__all__ = ["Guard", "owed_reply", "substitute"]


class Guard:
    """Counts and logs contained failures into ``counters`` (a status dict's counters)."""

    def __init__(self, log: logging.Logger, counters: dict[str, int]) -> None:
        self.log = log
        self.counters = counters
        counters.setdefault("protocol_errors", 0)
        counters.setdefault("internal_errors", 0)

    def protocol(self, peer: str, exc: BaseException) -> None:
        """Input from ``peer`` was malformed or refused."""
        self.counters["protocol_errors"] += 1
        self.log.warning("bad message from %s: %s", peer, exc)

    def internal(
        self, peer: str, msg: Record | None, exc: BaseException, *, rank: int | None = None
    ) -> Record | None:
        """Handling (or encoding) ``msg`` from ``peer`` raised ``exc``: count it, log it and
        return the error answer its sender waits for (None when nothing is owed)."""
        self.counters["internal_errors"] += 1
        what = msg.TAG if msg is not None else "timers"
        self.log.error(
            "internal error handling %r from %s: %s: %s",
            what,
            peer,
            type(exc).__name__,
            _short(exc),
            exc_info=exc,
        )
        if msg is None:
            return None
        return owed_reply(msg, _info(exc, rank, what), rank)


def owed_reply(msg: Record, error: ErrorInfo, rank: int | None = None) -> Record | None:
    """The error answer for a request ``msg`` whose handling failed, if its sender waits.

    ``rank`` is set when a worker answers the broker (jobs fail as ``Failed``, fanned-out
    requests as ``Ack``); without it the broker answers a driver.
    """
    if isinstance(msg, Exec):
        if rank is not None:
            return Failed(msg.session, msg.job, rank, error)
        return JobResult(msg.job, error=error)
    if isinstance(msg, (SaveSymbol, DeleteSymbol)) and rank is not None:
        return Ack(msg.req, rank, error)
    if isinstance(msg, (Reply, Ack)):
        return None  # an answer itself: nobody waits on it
    req = getattr(msg, "req", None)
    if type(req) is int or isinstance(msg, Fetch):
        return Reply(int(req or 0), error=error)
    return None


def substitute(msg: Record, exc: BaseException, rank: int | None = None) -> Record | None:
    """What to send instead of ``msg`` when ``msg`` itself cannot be encoded (a result
    whose value does not pickle, say): the same answer, carrying the error."""
    what = f"encoding {msg.TAG!r}"
    error = _info(exc, rank, what)
    if isinstance(msg, Reply):
        return Reply(msg.req, error=error)
    if isinstance(msg, Done):
        return Failed(msg.session, msg.job, msg.rank, error)
    if isinstance(msg, Ack):
        return Ack(msg.req, msg.rank, error)
    if isinstance(msg, JobResult):
        return JobResult(msg.job, error=error)
    return None


def _info(exc: BaseException, rank: int | None, op: str) -> ErrorInfo:
    # built by hand, not by to_info: the exception's own text may be what failed
    name = type(exc).__name__
    kind = name if isinstance(exc, MplError) else "RemoteError"
    return ErrorInfo(kind, _short(exc), rank, op, name)


def _short(exc: BaseException, limit: int = 500) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose text itself fails (a 5,000-digit int in it)
        text = f"<{type(exc).__name__} without a printable message>"
    return text if len(text) <= limit else text[:limit] + "..."
