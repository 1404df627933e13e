"""Each session's ``runtime_info`` for this worker's node: checked when the session opens,
then seen by kernels (:func:`mpl.worker.kernel_table.runtime_info`).

A session opened with its own spec brings its own runtime_info for every node it names
(``SessionRuntime``, from the broker). This worker refuses it (a ``ClusterSpecError`` in
the ``Ack``, which fails the driver's open) when its ``version`` or ``platform`` asks for a
runtime this node does not run, by the rule of :mod:`mpl.wire.runtime_info`. Sessions
without their own (and sessions not yet announced) see the node's entry in the spec the
worker joined with. A session refused when this worker joined late (no driver waits for
that answer) fails each of its jobs here with the reason instead. No I/O.

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

from mpl.wire.fingerprint import fingerprint
from mpl.wire.jobs import Exec, Failed
from mpl.wire.limits import MAX_RUNTIME_INFO_TOTAL, MAX_SESSIONS
from mpl.wire.lru import LRU
from mpl.wire.remote import ErrorInfo
from mpl.wire.runtime_info import incompatibility, info_weight, oversize, own_runtime
from mpl.wire.sessions import Ack, SessionRuntime

__all__ = ["SessionRuntimes"]


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
    sessions without their own see, and a runtime this node is taken to serve.
    """

    def __init__(
        self,
        rank: int,
        declared: Callable[[], Mapping[str, Any]],
        *,
        budget: int = MAX_RUNTIME_INFO_TOTAL,
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
        # session -> why this node refused it (mostly empty: then a job's check makes no call)
        self.refused_sessions: LRU[str, str] = LRU(MAX_SESSIONS)
        self.refused = 0

    def open(self, msg: SessionRuntime) -> Ack | None:
        """Keep ``msg``'s runtime_info if this node serves it; the answer for the broker
        (None when it asked for none)."""
        why = self.refusal(msg.runtime_info)
        self._release(msg.session)  # announced again: what it brings now replaces it
        if why is None:
            why = self._keep(msg.session, msg.runtime_info)
        if why is None:
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

    def _release(self, session: str) -> None:
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
        self._kept.clear()
        self.weight = 0
        self.refused_sessions.clear()

    def of(self, session: str) -> dict[str, Any]:
        """What kernels of ``session`` see as this node's runtime_info (a copy)."""
        kept = self._sessions.get(session)
        return dict(kept.info) if kept is not None else dict(self._declared())

    def __len__(self) -> int:
        return len(self._sessions)
