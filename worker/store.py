"""The worker's object store: values by URI, per session, plus names persisted on disk.

URIs: ``<job>/<output>`` for graph outputs, ``sym:<name>`` for a named value. A name is
looked up in the session first, then among the values persisted under the data root, which
outlive sessions and restarts (``mpl.worker.symbol_disk``: a failed or interrupted save
never loses the value it replaces).

A finished run's outputs are kept under its job id (:meth:`ObjectStore.put_outputs`), not
as one entry per output under a URI made for it: the value itself for a job of one output
(most), else the run's list. A job's values then cost one entry keyed by the id it arrived
with, and no string is formatted or hashed for them. An output URI is read back into its
job and index when someone asks for it (a fetch, a binding, a delete), which is rare next
to storing.

A secure worker reads a persisted value only in a session bound here to the value's owner
(``owner_of``: the session's owner by ``mpl.worker.admission``; ``mpl.worker.symbol_owner``
says why), whatever reads it: a fetch, a job's input binding, a ``load`` op.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from mpl.wire.errors import SessionError
from mpl.worker.symbol_disk import SymbolDisk

__all__ = ["ABSENT", "ObjectStore", "SymbolDisk", "output_place", "symbol_uri"]


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


# An output this rank does not hold (the interpreter's runs return it in place of a value).
ABSENT: Any = _Absent()


def symbol_uri(name: str) -> str:
    return f"sym:{name}"


# an output index has at most this many digits (a job of a billion outputs is none)
_INDEX_DIGITS = 9


def output_place(uri: str) -> tuple[str, int] | None:
    """The job and output index an output URI (``mpl.wire.jobs.output_uri``) names, or
    None if ``uri`` is not one: the index is written as ``output_uri`` writes it (ASCII
    digits, no leading zero), so no other spelling reaches the same value."""
    job, slash, index = uri.rpartition("/")
    if not slash or not index.isascii() or not index.isdigit():
        return None
    if len(index) > 1 and index[0] == "0":
        return None
    if len(index) > _INDEX_DIGITS:  # no job has that many outputs (and int() would refuse
        return None  # past 4,300 digits: a hostile URI must name nothing, not raise)
    return job, int(index)


class _Several:
    """The outputs of a job of more than one (ABSENT where not held, or deleted)."""

    __slots__ = ("outputs",)

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = outputs


class ObjectStore:
    """Per-session values. Thread-safe: jobs write, the I/O thread reads."""

    def __init__(
        self, disk: SymbolDisk | None = None, owner_of: Callable[[str], str] | None = None
    ) -> None:
        self.disk = disk
        # secure mode: the driver a session is bound to here ("": none), whose persisted
        # values alone the session reads; None (plaintext): any session reads any
        self.owner_of = owner_of
        self._sessions: dict[str, dict[str, Any]] = {}  # values put by URI (names, ...)
        # per session, each job's outputs: the value of its one output, or _Several; a job
        # goes once it holds none
        self._outputs: dict[str, dict[str, Any]] = {}
        # values held in _outputs past one per job (a job of several's): count() is the
        # entries plus this, without a walk over them
        self._extra = 0
        self._lock = threading.Lock()

    def put(self, session: str, uri: str, value: Any) -> None:
        with self._lock:
            self._sessions.setdefault(session, {})[uri] = value

    def put_outputs(self, session: str, job: str, outputs: list[Any]) -> None:
        """Keep a finished run's ``outputs`` (ABSENT where not held; at least one held) as
        output ``<job>/<index>`` each. The list becomes the store's."""
        if len(outputs) == 1:
            self.put_output(session, job, outputs[0])
            return
        held = _Several(outputs)
        if _held_in(held):  # else none held here
            self.put_output(session, job, held, several=True)

    def put_output(self, session: str, job: str, value: Any, several: bool = False) -> None:
        """Keep a run's one output ``value`` as output ``<job>/0``: no list made for it (the
        inline path's; written out in ``Jobs.run_repeat``'s common case while no job of
        several is held). ``several``: ``value`` is :meth:`put_outputs`' list of them."""
        lock = self._lock  # not `with` (once per job): acquire and release cost less
        lock.acquire()
        try:
            jobs = self._outputs.get(session)
            if jobs is None:
                jobs = self._outputs[session] = {}
            if self._extra:  # a job of several held somewhere: this id may name one
                self._extra -= _extra(jobs.get(job, ABSENT))
            jobs[job] = value
            if several:
                self._extra += _extra(value)
        finally:
            lock.release()

    def get(self, session: str, uri: str) -> Any:
        with self._lock:
            value = self._held(session, uri)
        if value is not ABSENT:
            return value
        if uri.startswith("sym:") and self.disk is not None:
            owner_of = self.owner_of
            reader = owner_of(session) if owner_of is not None else None
            return self.disk.load(uri[4:], reader)  # SymbolDisk checks the name: no path out
        raise SessionError(f"no value {uri!r} in session {session} on this worker")

    def has(self, session: str, uri: str) -> bool:
        with self._lock:
            return self._held(session, uri) is not ABSENT

    def held(self, session: str, uri: str) -> Any:
        """The value under ``uri`` held in memory here (never loaded from disk), or ABSENT."""
        with self._lock:
            return self._held(session, uri)

    def _held(self, session: str, uri: str) -> Any:
        """The value under ``uri`` in ``session`` held here, or ABSENT (lock held)."""
        objects = self._sessions.get(session)
        if objects is not None and uri in objects:
            return objects[uri]
        place = output_place(uri)
        if place is None:
            return ABSENT
        job, index = place
        held = self._outputs.get(session, {}).get(job, ABSENT)
        if type(held) is _Several:
            return held.outputs[index] if index < len(held.outputs) else ABSENT
        return held if index == 0 else ABSENT

    def delete(self, session: str, uris: list[str]) -> None:
        with self._lock:
            objects = self._sessions.get(session, {})
            jobs = self._outputs.get(session, {})
            for uri in uris:
                if objects and objects.pop(uri, ABSENT) is not ABSENT:
                    continue
                job, _, index = uri.rpartition("/")
                held = jobs.get(job, ABSENT)
                if index == "0" and held is not ABSENT and type(held) is not _Several:
                    del jobs[job]  # most: a job's one output, without output_place's call
                    continue
                place = output_place(uri)  # the same job, if any
                if place is None or type(held) is not _Several or place[1] >= len(held.outputs):
                    continue
                if held.outputs[place[1]] is ABSENT:
                    continue
                held.outputs[place[1]] = ABSENT
                if _held_in(held):
                    self._extra -= 1
                else:
                    del jobs[job]

    def drop_job(self, session: str, job: str) -> None:
        """Forget the outputs of an aborted job."""
        prefix = f"{job}/"
        with self._lock:
            self._extra -= _extra(self._outputs.get(session, {}).pop(job, ABSENT))
            objects = self._sessions.get(session, {})
            for uri in [u for u in objects if u.startswith(prefix)]:
                del objects[uri]

    def close(self, session: str) -> int:
        """Forget a session's values; how many there were."""
        with self._lock:
            jobs = self._outputs.pop(session, {})
            extra = sum(map(_extra, jobs.values()))
            self._extra -= extra
            return len(self._sessions.pop(session, {})) + len(jobs) + extra

    def close_all(self) -> None:
        with self._lock:
            self._sessions.clear()
            self._outputs.clear()
            self._extra = 0

    def count(self) -> int:
        """How many values are held, over all sessions."""
        with self._lock:
            named = sum(map(len, self._sessions.values()))
            return named + sum(map(len, self._outputs.values())) + self._extra

    def stats(self) -> dict[str, int]:
        return self.disk.stats() if self.disk is not None else {}

    def session_ids(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys([*self._sessions, *self._outputs]))


def _extra(held: Any) -> int:
    """The values a job's entry holds past one (0 unless it holds several)."""
    return _held_in(held) - 1 if type(held) is _Several else 0


def _held_in(several: _Several) -> int:
    """How many of a job's outputs are held (by identity: ``count`` would compare values,
    and an array's comparison is no truth value)."""
    return sum(value is not ABSENT for value in several.outputs)
