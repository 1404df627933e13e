"""Each session's ``runtime_info`` for this worker's node: checked when the session opens,
then seen by kernels (:func:`mpl.worker.kernel_table.runtime_info`).

A session opened with its own spec brings its own runtime_info for every node it names
(``SessionRuntime``, from the broker). This worker refuses it (a ``ClusterSpecError`` in
the ``Ack``, which fails the driver's open) when its ``version`` or ``platform`` asks for a
runtime this node does not run, by the rule of :mod:`mpl.wire.runtime_info`. Sessions
without their own (and sessions not yet announced) see the node's entry in the spec the
worker joined with. A session refused when this worker joined late (no driver waits for
that answer) fails each of its jobs here with the reason instead. No I/O.

The same message brings the session's SPU devices (name -> members' ranks): the only
devices an SPU member runs the session's ops on (:meth:`SessionRuntimes.spu_devices`; red
team w33, R33-4: a device name the driver made up would be a libspu lane kept per name).
Sessions without their own spec run on the cluster's devices. The tables are bounded like
the runtime_info (a broker's word): at most ``MAX_SESSION_DEVICES`` devices of names of at
most ``MAX_SPEC_NAME_CHARS`` per session, ``MAX_SPU_TABLE_ENTRIES`` devices and members
per session and ``MAX_SPU_TABLES_TOTAL`` in all; a session past them is refused alike.

All sessions' runtime_info together is kept within a budget (``MAX_RUNTIME_INFO_TOTAL``,
weighed by ``info_weight``; red team w32, R32-6): each session's is bounded, but a broker
may announce up to ``MAX_SESSIONS`` of them. Sessions bringing equal runtime_info (a
driver's sessions over one spec, mostly) share one copy, counted once, found by its
fingerprint (one hash lookup, whatever else is kept). A session whose
runtime_info would take the kept past the budget is refused like an incompatible one: its
open fails at its driver with a ``ClusterSpecError`` saying so, and sessions already open
keep theirs. A new broker (a restart) has none of the sessions announced before: all that
they kept is freed when it welcomes the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mpl.wire.cluster_entries import MAX_SPEC_NAME_CHARS
from mpl.wire.fingerprint import fingerprint
from mpl.wire.jobs import Exec, Failed
from mpl.wire.limits import MAX_RUNTIME_INFO_TOTAL, MAX_SESSIONS
from mpl.wire.lru import LRU
from mpl.wire.remote import ErrorInfo
from mpl.wire.runtime_info import incompatibility, info_weight, oversize, own_runtime
from mpl.wire.session_cluster import MAX_SESSION_DEVICES, spu_devices
from mpl.wire.sessions import Ack, SessionRuntime

__all__ = ["MAX_SPU_TABLES_TOTAL", "MAX_SPU_TABLE_ENTRIES", "SessionRuntimes"]

MAX_SPU_TABLE_ENTRIES = 1 << 16  # one session's SPU devices and their members, counted
MAX_SPU_TABLES_TOTAL = 1 << 20  # the same over every open session kept here


class _Kept:
    """One runtime_info kept, under what key, and how many open sessions brought it."""

    __slots__ = ("info", "key", "users", "weight")

    def __init__(self, info: dict[str, Any], weight: int, key: object) -> None:
        self.info = info
        self.weight = weight
        self.key = key
        self.users = 0


class SessionRuntimes:
    """The runtime_info of each open session on node ``rank``.

    ``declared`` gives the node's runtime_info in the spec this worker joined with: what
    sessions without their own see, and a runtime this node is taken to serve. ``cluster``
    gives that spec (dict form; {} for none yet): its SPU devices are those of sessions
    without their own.
    """

    def __init__(
        self,
        rank: int,
        declared: Callable[[], Mapping[str, Any]],
        *,
        budget: int = MAX_RUNTIME_INFO_TOTAL,
        cluster: Callable[[], Mapping[str, Any]] = dict,
    ) -> None:
        self.rank = rank
        self.budget = budget
        self.weight = 0  # of every runtime_info kept (each shared copy once)
        # kept copies by fingerprint (mpl.wire.fingerprint): an equal one is one hash
        # lookup away, whatever a broker announced before (review w32, B4: a search by
        # comparison cost the square of the number of look-alikes it sent)
        self._kept: dict[object, _Kept] = {}
        self._declared = declared
        # what this process runs (its code's version and platform), made when a session
        # first brings runtime_info to check
        self._own: dict[str, str] | None = None
        # one entry per open session, in order of its open; the broker holds at most
        # MAX_SESSIONS open, and an entry of a session whose close never came is the first
        # to go
        self._sessions: dict[str, _Kept] = {}
        # the SPU devices of each session in _sessions (its own spec's), kept and dropped
        # with its entry there: at most MAX_SESSIONS, each of at most MAX_SESSION_DEVICES
        self._spu_devices: dict[str, dict[str, tuple[int, ...]]] = {}
        self.spu_entries = 0  # devices and members in _spu_devices
        self._cluster = cluster
        # session -> why this node refused it (mostly empty: then a job's check makes no call)
        self.refused_sessions: LRU[str, str] = LRU(MAX_SESSIONS)
        self.refused = 0

    def open(self, msg: SessionRuntime) -> Ack | None:
        """Keep ``msg``'s runtime_info if this node serves it; the answer for the broker
        (None when it asked for none)."""
        why = self.refusal(msg.runtime_info)
        self._release(msg.session)  # announced again: what it brings now replaces it
        if why is None:
            why = self._spu_table_fault(msg.spu_devices)
        if why is None:
            why = self._keep(msg.session, msg.runtime_info)
        if why is None:
            self._spu_devices[msg.session] = {
                name: tuple(members) for name, members in msg.spu_devices.items()
            }
            self.spu_entries += _entries(msg.spu_devices)
            self.refused_sessions.pop(msg.session, None)
        else:
            self.refused += 1
            self.refused_sessions[msg.session] = why
        if not msg.req:
            return None
        error = None if why is None else ErrorInfo("ClusterSpecError", why, rank=self.rank)
        return Ack(msg.req, self.rank, error)

    def _keep(self, session: str, info: Mapping[str, Any]) -> str | None:
        """Keep ``session``'s ``info`` within the budget; why not, or None."""
        weight = info_weight(info)
        key: object = fingerprint(info)
        kept = self._kept.get(key) if key is not None else None
        if kept is None:
            if self.weight + weight > self.budget:
                return (
                    f"rank {self.rank}: this node keeps at most {self.budget} bytes of "
                    f"open sessions' runtime_info, {self.weight} of which are taken: this "
                    f"session's ({weight}) does not fit; close sessions that bring their "
                    "own, or open this one with less (or none: the node's own)"
                )
            if key is None:  # a value the fingerprint does not cover: kept unshared
                key = object()
            kept = self._kept[key] = _Kept(dict(info), weight, key)
            self.weight += weight
        if len(self._sessions) >= MAX_SESSIONS:  # the oldest, whose close never came
            self._release(next(iter(self._sessions)))
        kept.users += 1
        self._sessions[session] = kept
        return None

    def _spu_table_fault(self, devices: Mapping[str, list[int]]) -> str | None:
        """Why a session's SPU device table is past the bounds, or None."""
        entries = _entries(devices)
        if len(devices) > MAX_SESSION_DEVICES or entries > MAX_SPU_TABLE_ENTRIES:
            return (
                f"spu_devices: {len(devices)} devices, {entries} entries; at most "
                f"{MAX_SESSION_DEVICES} devices, {MAX_SPU_TABLE_ENTRIES} entries"
            )
        if any(len(name) > MAX_SPEC_NAME_CHARS for name in devices):
            return f"spu_devices: a device name of more than {MAX_SPEC_NAME_CHARS} characters"
        if self.spu_entries + entries > MAX_SPU_TABLES_TOTAL:
            return (
                f"rank {self.rank}: this node keeps at most {MAX_SPU_TABLES_TOTAL} entries "
                f"of open sessions' SPU devices, {self.spu_entries} of which are taken"
            )
        return None

    def _release(self, session: str) -> None:
        table = self._spu_devices.pop(session, None)
        if table is not None:
            self.spu_entries -= _entries(table)
        kept = self._sessions.pop(session, None)
        if kept is None:
            return
        kept.users -= 1
        if kept.users:
            return
        self.weight -= kept.weight
        del self._kept[kept.key]

    def refusal(self, info: Any) -> str | None:
        """Why this node refuses a session asking for ``info``, or None if it serves it."""
        if not isinstance(info, Mapping):
            return f"runtime_info: expected a mapping, got {type(info).__name__}"
        too_big = oversize(info)
        if too_big is not None:
            return f"runtime_info: {too_big}"
        own = self._own
        if own is None:
            own = self._own = own_runtime()
        why = incompatibility(info, own, self._declared())
        return None if why is None else f"rank {self.rank}: {why}"

    def failed(self, msg: Exec) -> Failed | None:
        """The failure of a job of a session this node refused, or None: it may run."""
        why = self.refused_sessions.get(msg.session)
        if why is None:
            return None
        info = ErrorInfo("ClusterSpecError", why, rank=self.rank, op="session", job=msg.job)
        return Failed(msg.session, msg.job, self.rank, info)

    def closed(self, session: str) -> None:
        self._release(session)
        self.refused_sessions.pop(session, None)

    def close_all(self) -> None:
        """A new broker: none of the sessions announced before is open any more (no
        SessionClosed will come for them), so what they kept is freed."""
        self._sessions.clear()
        self._spu_devices.clear()
        self.spu_entries = 0
        self._kept.clear()
        self.weight = 0
        self.refused_sessions.clear()

    def of(self, session: str) -> dict[str, Any]:
        """What kernels of ``session`` see as this node's runtime_info (a copy)."""
        kept = self._sessions.get(session)
        return dict(kept.info) if kept is not None else dict(self._declared())

    def spu_devices(self, session: str) -> Mapping[str, tuple[int, ...]]:
        """The SPU devices ``session`` runs on, each with its members' ranks: its own
        spec's, else the cluster's. Asked only when an SPU member would make a new lane."""
        own = self._spu_devices.get(session)
        if own is not None:
            return own
        return {name: tuple(m) for name, m in spu_devices(self._cluster()).items()}

    def __len__(self) -> int:
        return len(self._sessions)


def _entries(devices: Mapping[str, Any]) -> int:
    """A device table's weight: its devices and their members."""
    return len(devices) + sum(len(members) for members in devices.values())
