"""The worker's object store: values by URI, per session, plus names persisted on disk.

URIs: ``<job>/<output>`` for graph outputs, ``sym:<name>`` for a named value. A name is
looked up in the session first, then among the values persisted under the data root, which
outlive sessions and restarts. Files are written atomically (temporary file, fsync,
rename), with the description written last, so a crash never leaves a half value behind.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

from mpl.wire.errors import ProtocolError, SessionError, UnsafeValueError
from mpl.wire.jobs import Lit
from mpl.wire.persist import dumps, loads
from mpl.wire.safe_values import unsafe
from mpl.wire.sessions import SymbolInfo

__all__ = ["ObjectStore", "SymbolDisk", "symbol_uri"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def symbol_uri(name: str) -> str:
    return f"sym:{name}"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"bad value name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


class SymbolDisk:
    """Values saved with ``persist=True``: ``<root>/symbols/<name>.value`` and ``.info``.

    Files hold the safe value format only: a value of another type is refused when saved,
    and a file holding a pickle (written by an older mpl) is refused, never unpickled.
    """

    def __init__(self, root: Path) -> None:
        self.dir = root / "symbols"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, Any] = {}

    def save(self, info: SymbolInfo, value: Any) -> None:
        name = check_name(info.name)
        try:
            data = dumps(Lit(value))
        except UnsafeValueError as exc:
            where = f"to disk (mp.save of {name!r} with persist=True)"
            raise unsafe(exc.type_name or "value", where) from None
        self._write(self.dir / f"{name}.value", data)
        self._write(self.dir / f"{name}.info", dumps(info))  # last: it marks the value complete
        self._cache[name] = value

    def load(self, name: str) -> Any:
        if name in self._cache:
            return self._cache[name]
        if not (self.dir / f"{name}.info").exists():
            raise SessionError(f"no value named {name!r} on this worker")
        path = self.dir / f"{name}.value"
        try:
            record = loads(path.read_bytes())
        except ProtocolError as exc:
            raise ProtocolError(
                f"refusing to load the persisted value {name!r} from {path}: {exc}. Files "
                "written by mpl before its safe value format may hold pickles, which are never "
                "loaded: re-create the value and save it again, or delete the file"
            ) from None
        if not isinstance(record, Lit):
            raise SessionError(f"the file for {name!r} does not hold a value")
        self._cache[name] = record.value
        return record.value

    def delete(self, name: str) -> None:
        self._cache.pop(name, None)
        for suffix in (".info", ".value"):
            (self.dir / f"{name}{suffix}").unlink(missing_ok=True)

    def infos(self) -> list[SymbolInfo]:
        out = []
        for path in sorted(self.dir.glob("*.info")):
            try:
                info = loads(path.read_bytes())
            except Exception:  # a damaged file must not stop the worker
                continue
            if isinstance(info, SymbolInfo):
                out.append(info)
        return out

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


class ObjectStore:
    """Per-session dictionaries of values. Thread-safe: jobs write, the I/O thread reads."""

    def __init__(self, disk: SymbolDisk | None = None) -> None:
        self.disk = disk
        self._sessions: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def put(self, session: str, uri: str, value: Any) -> None:
        with self._lock:
            self._sessions.setdefault(session, {})[uri] = value

    def get(self, session: str, uri: str) -> Any:
        with self._lock:
            objects = self._sessions.get(session, {})
            if uri in objects:
                return objects[uri]
        if uri.startswith("sym:") and self.disk is not None:
            return self.disk.load(check_name(uri[4:]))  # no path out of the data root
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

    def session_ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)
