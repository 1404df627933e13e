"""The worker's object store: values by URI, per session, plus names persisted on disk.

URIs: ``<job>/<output>`` for graph outputs, ``sym:<name>`` for a named value. A name is
looked up in the session first, then among the values persisted under the data root, which
outlive sessions and restarts (``mpl.worker.symbol_disk``: a failed or interrupted save
never loses the value it replaces).
"""

from __future__ import annotations

import threading
from typing import Any

from mpl.wire.errors import SessionError
from mpl.worker.symbol_disk import SymbolDisk

__all__ = ["ObjectStore", "SymbolDisk", "symbol_uri"]


def symbol_uri(name: str) -> str:
    return f"sym:{name}"


class ObjectStore:
    """Per-session dictionaries of values. Thread-safe: jobs write, the I/O thread reads."""

    def __init__(self, disk: SymbolDisk | None = None) -> None:
        self.disk = disk
        self._sessions: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def put(self, session: str, uri: str, value: Any) -> None:
        lock = self._lock  # not `with` (once per output): acquire and release cost less
        lock.acquire()
        try:
            self._sessions.setdefault(session, {})[uri] = value
        finally:
            lock.release()

    def get(self, session: str, uri: str) -> Any:
        with self._lock:
            objects = self._sessions.get(session, {})
            if uri in objects:
                return objects[uri]
        if uri.startswith("sym:") and self.disk is not None:
            return self.disk.load(uri[4:])  # SymbolDisk checks the name: no path out
        raise SessionError(f"no value {uri!r} in session {session} on this worker")

    def has(self, session: str, uri: str) -> bool:
        with self._lock:
            return uri in self._sessions.get(session, {})

    def delete(self, session: str, uris: list[str]) -> None:
        with self._lock:
            objects = self._sessions.get(session)
            if objects is not None:
                for uri in uris:
                    objects.pop(uri, None)

    def drop_job(self, session: str, job: str) -> None:
        """Forget the outputs of an aborted job."""
        prefix = f"{job}/"
        with self._lock:
            objects = self._sessions.get(session, {})
            for uri in [u for u in objects if u.startswith(prefix)]:
                del objects[uri]

    def close(self, session: str) -> int:
        with self._lock:
            return len(self._sessions.pop(session, {}))

    def close_all(self) -> None:
        with self._lock:
            self._sessions.clear()

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._sessions.values())

    def stats(self) -> dict[str, int]:
        return self.disk.stats() if self.disk is not None else {}

    def session_ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)
