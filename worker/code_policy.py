"""``mpl-worker --code kernels``: run named kernels and built-in ops, never shipped code.

Under this policy every message (from the broker or a peer) is decoded once, in the safe
value format (:func:`screen`): a pickle anywhere in it stops the decode before it is loaded,
and only then is the message decoded again with its pickles left opaque
(:class:`mpl.wire.codec.Pickled`), to say which program, job or move is refused. Nothing in
it is ever unpickled: unpickling is where shipped code would run. A message holding no
pickle, the usual case, is decoded once and used as it is. A refused peer move fails its
job at once. What still works is what
travels without pickles: ``mp.kernel`` calls (a name, resolved to the operator's installed
kernels), moves, SPU seal and reveal, constants, and arrays, numbers and strings as inputs.
``spu.run`` carries a pickled JAX function, so it is refused too. A program is checked as a
whole, without unpickling any of it: one that ships a pickled function for another party is
refused here as well, so keep such a party's part of a program to kernels and built-in ops.

A refused program is remembered (boundedly) by digest, and every job that runs it fails
with a ``RemotePermissionError`` (a ``RemoteError`` that is also a ``PermissionError``).

Per driver (secure mode): the node's own spec may list a driver with ``code: kernels``
(:func:`driver_code_policy`); on a ``--code any`` worker that driver's jobs, by the driver
that sealed them, are held to this policy (``mpl.worker.sealing``), the others' run any code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import Pickled, decode
from mpl.wire.data import Move
from mpl.wire.errors import ProtocolError
from mpl.wire.identity import driver_identity
from mpl.wire.jobs import Exec, Program
from mpl.wire.record import Record, record_fields
from mpl.wire.remote import ErrorInfo
from mpl.worker.state_events import CodeRefused, ExecUnloadable, MoveRefused, ProgramUnloadable

__all__ = [
    "CODE_POLICIES",
    "REFUSAL",
    "HoldsPickles",
    "driver_code_policy",
    "holds_pickle",
    "open_sealed",
    "pickled",
    "refusal",
    "screen",
    "unloadable",
]

CODE_POLICIES = ("any", "kernels")
REFUSAL = (
    "this worker runs only named kernels and built-in ops (mpl-worker --code kernels): "
    "it refused {what}, which carries pickled code or objects, without unpickling it; "
    "call an installed kernel with mp.kernel(name) instead"
)
_MAX_DEPTH = 64


def driver_code_policy(own: ClusterSpec | None, code: str) -> frozenset[str]:
    """The drivers (identities) a worker run with ``--code code`` holds to named kernels by
    its own spec ``own`` (its drivers listed ``code: kernels``), beyond what ``code`` says.
    Empty under ``--code kernels`` (every driver is held to it); a driver listed ``code:
    any`` there raises ``ValueError``: the flag is the worker's bound, an entry only
    narrows it (run ``--code any`` and list the others ``code: kernels``)."""
    if own is None:
        return frozenset()
    if code == "kernels":
        loose = [d.name for d in own.drivers if d.code == "any"]
        if loose:
            raise ValueError(
                f"the cluster spec lists driver(s) {', '.join(loose)} with code: any, but this "
                "worker runs --code kernels (named kernels only, for every driver): run it "
                "with --code any and list the other drivers with code: kernels"
            )
        return frozenset()
    return frozenset(driver_identity(d.name) for d in own.drivers if d.code == "kernels")


def holds_pickle(value: Any, depth: int = 0) -> bool:
    """True if a message decoded with ``unpickle=False`` holds a pickled value anywhere."""
    if isinstance(value, Pickled):
        return True
    if depth > _MAX_DEPTH:  # absurdly deep: refuse rather than recurse further
        return True
    if isinstance(value, Record):
        return any(holds_pickle(v, depth + 1) for v in record_fields(value))
    if isinstance(value, (list, tuple, set, frozenset)):  # (a set's items: the SET ext)
        return any(holds_pickle(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(
            holds_pickle(k, depth + 1) or holds_pickle(v, depth + 1) for k, v in value.items()
        )
    return False


def pickled(frames: Sequence[Any]) -> Record | None:
    """The message decoded with nothing unpickled, if it holds a pickle; None if it holds
    none, or does not decode (the caller's normal path counts and logs that)."""
    try:
        opaque = decode(frames, unpickle=False)
    except ProtocolError:
        return None
    return opaque if holds_pickle(opaque) else None


@dataclass(frozen=True, slots=True)
class HoldsPickles:
    """What :func:`screen` gives for a message holding pickles: the message decoded with
    nothing unpickled (``opaque``), for :func:`refusal`."""

    opaque: Record


def screen(frames: Sequence[Any], code: str, *, safe: bool) -> Record | HoldsPickles:
    """Decode a message from another process under the code policy ``code``, in one pass.

    ``"any"``: the message, decoded with ``safe`` (pickles refused when it is True).
    ``"kernels"``: the message, when it holds no pickle (decoded once, in the safe value
    format, whatever ``safe`` says); :class:`HoldsPickles` when it holds one, none of them
    loaded. Raises :class:`ProtocolError` for a malformed message, as ``decode`` does.
    """
    if code == "any":
        return decode(frames, safe=safe)
    try:
        return decode(frames, safe=True)  # stops at the first pickle, before loading it
    except ProtocolError:
        # a pickle, or malformed: the opaque decode tells them apart, as it did when it
        # screened every message first (so the same messages are refused as before)
        opaque = pickled(frames)
        if opaque is None:
            raise
        return HoldsPickles(opaque)


class _Opener(Protocol):
    def open(self, sealed: Any, context: str, *, safe: bool = ..., unpickle: bool = ...) -> Any: ...


def open_sealed(sealer: _Opener, sealed: Any, context: str) -> tuple[str, Any]:
    """``--code kernels``: open what a driver sealed for this worker, decoded once when it
    holds no pickle (the safe-format decode stops at the first one, unloaded). A payload
    holding pickles is opened again with them left opaque (``Pickled``), for the caller to
    refuse; an altered payload raises ``AuthenticationError``, a malformed one
    ``ProtocolError``, as ``Sealer.open`` does."""
    try:
        opened: tuple[str, Any] = sealer.open(sealed, context, safe=True)
        return opened
    except ProtocolError:
        opaque: tuple[str, Any] = sealer.open(sealed, context, safe=False, unpickle=False)
        if holds_pickle(opaque[1]):
            return opaque
        raise


def refusal(opaque: Record, rank: int) -> CodeRefused | ExecUnloadable | MoveRefused | None:
    """The state machine's event for a message refused for holding pickles (None: it is
    none of a program, a job or a move to this rank, so only counted)."""
    if isinstance(opaque, Program):
        name = opaque.graph.name if opaque.graph is not None else ""
        return CodeRefused(opaque.digest, REFUSAL.format(what=f"program {name or opaque.digest}"))
    if isinstance(opaque, Exec):
        why = REFUSAL.format(what="the job's inputs")
        info = ErrorInfo(
            "RemoteError", why, rank=rank, op="program", remote_type="PermissionError",
            job=opaque.job,
        )  # fmt: skip
        return ExecUnloadable(opaque.session, opaque.job, info)
    if isinstance(opaque, Move) and opaque.dst == rank:
        # Fail the job now rather than let it wait for a value it will never accept.
        why = REFUSAL.format(what=f"a value moved from rank {opaque.src}")
        info = ErrorInfo(
            "RemoteError", why, rank=rank, op=f"{opaque.op} (move from rank {opaque.src})",
            remote_type="PermissionError", job=opaque.job,
        )  # fmt: skip
        return MoveRefused(opaque.session, opaque.job, info)
    return None


def unloadable(opaque: Record, rank: int, why: str) -> ProgramUnloadable | ExecUnloadable | None:
    """The event for a program or job whose values do not unpickle here (say, a module this
    worker lacks), so the job that needs it fails with that reason; None for others."""
    if isinstance(opaque, Program):
        return ProgramUnloadable(opaque.digest, why)
    if isinstance(opaque, Exec):
        info = ErrorInfo(
            "ProtocolError", f"cannot load the job's inputs here: {why}", rank=rank,
            op="inputs", job=opaque.job,
        )  # fmt: skip
        return ExecUnloadable(opaque.session, opaque.job, info)
    return None
