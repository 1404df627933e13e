"""Errors: the tree, and crossing the wire with their remote details."""

from __future__ import annotations

import pytest

from mpl.wire import (
    ClusterSpecError,
    DeviceNotFoundError,
    ErrorInfo,
    MplError,
    MplTimeoutError,
    RemoteError,
    WorkerLostError,
    decode,
    encode,
    errors,
    from_info,
    to_info,
)


def test_every_error_is_documented_and_under_mpl_error() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, MplError)
        assert cls.__doc__ and len(cls.__doc__) > 40, name
    assert issubclass(ClusterSpecError, ValueError)
    assert issubclass(MplTimeoutError, TimeoutError)


def wire(info: ErrorInfo) -> ErrorInfo:
    out = decode(encode(info))
    assert isinstance(out, ErrorInfo)
    return out


def test_foreign_exception_becomes_remote_error_with_details() -> None:
    try:
        {}["missing"]  # type: ignore[index]  # the KeyError is the point
    except KeyError as exc:
        info = to_info(exc, rank=1, op="3 (pcall f)", job="j1")
    err = from_info(wire(info))
    assert isinstance(err, RemoteError)
    assert (err.rank, err.op, err.remote_type, err.job) == (1, "3 (pcall f)", "KeyError", "j1")
    assert "missing" in err.remote_message
    assert "Traceback" in err.remote_traceback
    text = str(err)
    assert "rank 1" in text and "KeyError" in text and "remote traceback" in text


def test_own_errors_keep_their_class() -> None:
    err = from_info(wire(to_info(WorkerLostError("rank 2 died", rank=2, job="j"))))
    assert isinstance(err, WorkerLostError) and err.rank == 2 and err.job == "j"
    err2 = from_info(wire(to_info(DeviceNotFoundError("no device 'X'"))))
    assert isinstance(err2, DeviceNotFoundError) and str(err2) == "no device 'X'"
    with pytest.raises(MplTimeoutError):
        wire(to_info(MplTimeoutError("slow"))).raise_()
