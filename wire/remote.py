"""Errors on the wire: :class:`ErrorInfo` and the mapping to and from exceptions."""

from __future__ import annotations

import traceback as _tb
from dataclasses import dataclass

from mpl.wire import errors as _e
from mpl.wire.printable import one_line, printable
from mpl.wire.record import Record

__all__ = ["ErrorInfo", "from_info", "to_info"]


@dataclass(eq=False, repr=False)
class ErrorInfo(Record, tag="error"):
    """An error as it crosses the wire: the mpl class name plus the remote details."""

    kind: str
    message: str
    rank: int | None = None
    op: str = ""
    remote_type: str = ""
    traceback: str = ""
    job: str = ""

    def raise_(self) -> None:
        raise from_info(self)


_KINDS: dict[str, type[_e.MplError]] = {
    cls.__name__: cls
    for cls in (
        _e.MplError,
        _e.ProtocolError,
        _e.MessageTooLargeError,
        _e.UnsafeValueError,
        _e.ClusterSpecError,
        _e.GraphError,
        _e.RegistrationError,
        _e.AuthenticationError,
        _e.SessionError,
        _e.SessionAccessError,
        _e.RemoteError,
        _e.WorkerLostError,
        _e.JobAbortedError,
        _e.MplTimeoutError,
        _e.DeviceError,
        _e.DeviceNotFoundError,
        _e.DeviceInferenceError,
    )
}


def to_info(
    exc: BaseException,
    *,
    rank: int | None = None,
    op: str = "",
    job: str = "",
    with_traceback: bool = True,
    remote: bool = False,
) -> ErrorInfo:
    """Describe ``exc`` for the wire.

    Exceptions that are not ours travel as ``RemoteError``; with ``remote=True`` ours do too
    (an error raised inside an op is reported where it happened, with its class name as
    ``remote_type``).
    """
    trace = "".join(_tb.format_exception(exc)) if with_traceback else ""
    if isinstance(exc, _e.RemoteError):
        return ErrorInfo(
            "RemoteError",
            exc.remote_message,
            exc.rank if exc.rank is not None else rank,
            exc.op or op,
            exc.remote_type,
            exc.remote_traceback or trace,
            exc.job or job,
        )
    message = str(exc.args[0]) if len(exc.args) == 1 else str(exc)
    own_rank = getattr(exc, "rank", None)
    if isinstance(exc, _e.MplError) and type(exc).__name__ in _KINDS and not remote:
        return ErrorInfo(
            type(exc).__name__,
            message,
            own_rank if own_rank is not None else rank,
            op,
            type(exc).__name__,
            trace,
            getattr(exc, "job", "") or job,
        )
    return ErrorInfo("RemoteError", message, rank, op, type(exc).__name__, trace, job)


def from_info(info: ErrorInfo) -> _e.MplError:
    """Rebuild the exception an :class:`ErrorInfo` describes.

    Its text is a worker's or the broker's word, printed wherever the exception is: control
    characters are escaped and the text cut (``wire/printable.py``), so a hostile party or
    broker cannot drive the reader's terminal through an error."""
    message = printable(info.message)
    cls = _KINDS.get(info.kind, _e.RemoteError)
    if cls is _e.RemoteError:
        remote = (
            _e.RemotePermissionError if info.remote_type == "PermissionError" else _e.RemoteError
        )
        return remote(
            message,
            rank=info.rank,
            op=one_line(info.op),
            remote_type=one_line(info.remote_type),
            remote_traceback=printable(info.traceback),
            job=one_line(info.job),
        )
    if cls is _e.WorkerLostError:
        return _e.WorkerLostError(message, rank=info.rank, job=one_line(info.job))
    if cls is _e.JobAbortedError:
        return _e.JobAbortedError(message, job=one_line(info.job), rank=info.rank)
    return cls(message)
