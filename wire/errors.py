"""Every error mpl raises, in one tree.

::

    MplError
    ├── ProtocolError             malformed or unexpected wire traffic
    ├── MessageTooLargeError      (also ValueError) a message over the --max-message limit
    ├── UnsafeValueError          (also TypeError) a value the safe format does not carry
    ├── ClusterSpecError          (also ValueError) a bad cluster description
    ├── GraphError                (also ValueError) a graph that fails the checker
    ├── RegistrationError         a worker the broker refused (duplicate rank, bad rank)
    ├── AuthenticationError       a peer whose key is not allowed
    ├── KeyFileError              (also ValueError) a missing or unusable CURVE key file
    ├── SessionError              (also KeyError) an unknown session or value name
    │   └── SessionAccessError    (also PermissionError) a session this driver may not use
    ├── RemoteError               code running on a worker raised
    │   └── RemotePermissionError (also PermissionError) a worker did not permit the op
    ├── WorkerLostError           a worker a job needed died or went silent
    ├── JobAbortedError           the job was stopped because another rank failed
    ├── MplTimeoutError           (also TimeoutError) a wait ran past its deadline
    └── DeviceError               misuse of the device API
        ├── DeviceNotFoundError   (also KeyError) no device of that name
        └── DeviceInferenceError  mp.device() could not pick a device

Errors cross the wire as ``mpl.wire.remote.ErrorInfo`` records and are re-raised on the driver
as the same class, carrying the remote rank, op and traceback.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "ClusterSpecError",
    "DeviceError",
    "DeviceInferenceError",
    "DeviceNotFoundError",
    "GraphError",
    "JobAbortedError",
    "KeyFileError",
    "MessageTooLargeError",
    "MplError",
    "MplTimeoutError",
    "ProtocolError",
    "RegistrationError",
    "RemoteError",
    "RemotePermissionError",
    "SessionAccessError",
    "SessionError",
    "UnsafeValueError",
    "WorkerLostError",
]


class MplError(Exception):
    """Base of every mpl error. Catch this to handle any failure of the runtime itself."""


class ProtocolError(MplError):
    """Wire data that does not decode: wrong magic or version, bad header, unknown tag,
    missing or extra frames, a field of the wrong type, or an oversize part.

    You see it when a peer speaks another mpl version or sends garbage. Daemons log it and
    keep serving; check that every process runs the same mpl release. A message naming a
    bound (``header builds more than ...``, ``exceeds 16777216``) is one of
    ``mpl.wire.limits``: a host value with too many items (a long Python list passed to or
    returned from a function) passes it; send bulk data as numpy arrays or bytes.
    """


class MessageTooLargeError(MplError, ValueError):
    """A message was bigger than the largest frame the peer that would receive it takes
    (its ``--max-message``, 4 GiB by default). You see it at once instead of a job that waits
    out its deadline: the driver refuses an Exec or program whose arguments or captured data
    are bigger than the broker's limit (announced in ``SessionOpened``) before sending it,
    and a worker fails the job (or fetch) whose result, or move to another rank, is bigger
    than the limit (its own, or the broker's from ``Welcome``) instead of sending it (libzmq
    would drop the message and the connection with it).

    Attributes ``size`` (bytes, at least; a value may be refused by a cheap lower bound
    before it is encoded) and ``limit``. Raise ``--max-message`` on the broker and the
    workers (all alike), or move the data as files the parties read themselves
    (``mpl.io.read_npy`` and the other ``mpl.io`` kernels) rather than through messages.
    """

    def __init__(self, message: str, *, size: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class UnsafeValueError(MplError, TypeError):
    """A value of a type the safe value format does not carry was about to cross a party
    boundary (a peer move, a result or fetch for a driver, a value persisted to disk).

    You see it at the sender, naming the type and where the value was going; nothing was
    sent. Return numpy arrays, numbers, strings, bytes, lists, tuples, dicts, sets or tables
    instead (see ``mpl.wire.safe_values``), or, only if one organisation runs every party,
    declare the cluster ``trusted: true`` so that pickles may cross.
    """

    type_name: str = ""


class ClusterSpecError(MplError, ValueError):
    """A cluster description is invalid; the message names the offending field.

    Fix the dict or YAML file: node names must be unique, device members must name nodes,
    a PPU has exactly one member, an SPU has a known protocol and field and enough members.
    """


class GraphError(MplError, ValueError):
    """A graph fails the checker: an undefined value, a wrong number of inputs or outputs,
    a rank outside the cluster, an unknown opcode, or a placement rule broken.

    Graphs come from tracing; if you built one by hand, fix the op the message names.
    """


class RegistrationError(MplError):
    """The broker refused a worker: its rank is outside the cluster or already held by a
    live worker.

    Start each rank once. A worker that died may re-register as soon as the broker has
    noticed its death (at most 3 s).
    """


class AuthenticationError(MplError):
    """A peer's key is not allowed, or it tried to take a rank pinned to another key; or,
    raised by a driver, the broker answered an open with a session other than the one asked
    for (``mpl.driver.client.Client.open_session``).

    Check the CURVE keys the daemons were started with and the keys pinned in the cluster
    (and, for a session answered wrongly, which broker you reach: its operator may lie).
    """


class KeyFileError(MplError, ValueError):
    """A CURVE key file is missing, holds only the public key where the secret one is
    needed, or holds something that is not a key; the message names the file.

    Make keys with ``mpl-keys new NAME``; give daemons and drivers the ``NAME.key_secret``
    file, and the other parties the ``NAME.key`` file's key (``mpl-keys show NAME.key``).
    """


class SessionError(MplError, KeyError):
    """An unknown session, or no value saved under that name in this session.

    Names are per session unless saved with ``persist=True``; check the spelling and that
    the session you attached to is the one that saved it.
    """

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class SessionAccessError(SessionError, PermissionError):
    """A driver used a session it does not own and was not shared with, asked for a
    persisted value without loading it into its own session, or otherwise acted for another
    driver. The message names the session and the identity the broker saw.

    In secure mode a worker refuses so too (op ``session`` for a job, ``fetch`` for a
    fetch), by the owner's own sealed word (``mpl.worker.admission``): a job or fetch of a
    driver the session's owner does not admit; a sharee's job on a worker the owner's word
    has not reached yet (the owner tells every live worker when it opens the session: one
    that joined later hears it with the owner's first job there); a job in a session bound
    on that worker to another driver (if that is not you, the broker let another driver's
    job claim it first: open a new session); or a new session on a worker holding its
    maximum of sessions' bindings, none closed.

    Sessions belong to the driver that opened them: ask the owner to share it
    (``mp.connect(url, session="s", share_with=["you"])``), or open your own session.
    """


class RemoteError(MplError):
    """Code running on a worker raised. The driver re-raises it with the remote details.

    Attributes: ``rank`` and ``op`` say where it happened, ``remote_type`` is the exception's
    class name on the worker, ``remote_message`` its text and ``remote_traceback`` the worker
    traceback. Fix the function the op ran; the rest of the job was aborted.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        op: str = "",
        remote_type: str = "",
        remote_traceback: str = "",
        job: str = "",
    ) -> None:
        super().__init__(message)
        self.remote_message = message
        self.rank = rank
        self.op = op
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
        self.job = job

    def __str__(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else "a worker"
        if self.op:
            where += f", op {self.op}"
        head = f"[{where}] {self.remote_type or 'Error'}: {self.remote_message}"
        if self.remote_traceback:
            head += "\n--- remote traceback ---\n" + self.remote_traceback.rstrip()
        return head


class RemotePermissionError(RemoteError, PermissionError):
    """A worker did not permit what the op asked: it runs only named kernels (``mpl-worker
    --code kernels``) and refused a pickled function or input without unpickling it, or a
    kernel refused a path outside the worker's data root, or the op raised PermissionError.

    Call a kernel that party installed (``mp.kernel(name)``), or ask its operator.
    """


class WorkerLostError(MplError):
    """A worker the job needed died (its socket closed) or stopped heartbeating for 3 s, or
    no worker ever registered for its rank (the message says "never registered").

    Attributes ``rank`` and ``reason``. The job's other ranks were released. Restart the
    worker (or start one: ``mpl-worker --broker URL --rank N``); it registers by itself and
    the next job can run. ``mpl-broker status URL`` shows which ranks are up.
    """

    def __init__(self, message: str, *, rank: int | None = None, job: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.job = job


class JobAbortedError(MplError):
    """This rank's part of a job was stopped because another rank failed or died.

    Workers see it internally; a driver sees the root cause (``RemoteError`` or
    ``WorkerLostError``) instead, unless the job was cancelled on purpose.
    """

    def __init__(self, message: str, *, job: str = "", rank: int | None = None) -> None:
        super().__init__(message)
        self.job = job
        self.rank = rank


class MplTimeoutError(MplError, TimeoutError):
    """A wait ran past its deadline: a reply, a peer move, a connection.

    Every blocking call in mpl has one. Raise the ``timeout=`` of the call if the work is
    legitimately slow; otherwise check ``ctx.status()`` for a dead or busy rank.
    """


class DeviceError(MplError):
    """Misuse of the device API: an unsupported move or a device of the wrong kind."""


class DeviceNotFoundError(DeviceError, KeyError):
    """No device of that name exists in the cluster; the message lists those that do."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DeviceInferenceError(DeviceError):
    """``mp.device()`` could not pick a device from the arguments.

    It needs exactly one device among them, or a single secure device (SPU) when several
    are involved. Name the device explicitly: ``mp.device("P0")``.
    """
