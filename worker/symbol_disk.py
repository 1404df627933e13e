"""Values saved with ``persist=True``: one file per name under ``<root>/symbols``.

A save never loses the value it replaces. The new file is written under a unique hidden
temporary name (``.<name>.<random>.tmp``), flushed and fsynced, published with ONE atomic
``os.replace`` onto ``<name>.sym``, and then the directory is fsynced so the rename itself
survives a power cut. A crash or a full disk at any point before the rename leaves the old
file untouched and loadable; the temporary file is removed on failure (and leftovers of a
crash are swept when the worker starts). Saves and deletes of one name are serialised by a
lock chosen by the name's hash (a fixed set of locks: names come from the network and must
not grow a table).

Files hold the safe value format only (see ``mpl.wire.persist``). A file that does not
read (truncated, damaged, a pickle from an older mpl) is reported: logged, counted in the
worker's status (``corrupt_files``) and named in the error of the load that found it. It
is never silently skipped. Files ``<name>.info`` + ``<name>.value`` written by earlier
mpl releases are still read (and replaced by the next save of that name).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import zlib
from pathlib import Path
from typing import Any

from mpl.wire.errors import ProtocolError, SessionError, UnsafeValueError
from mpl.wire.jobs import Lit
from mpl.wire.limits import check_symbol_name as check_name
from mpl.wire.lru import LRU, SizedLRU
from mpl.wire.persist import loads, read_symbol_head, split_symbol, symbol_chunks
from mpl.wire.safe_values import unsafe
from mpl.wire.sessions import SymbolInfo

__all__ = ["CACHE_BYTES", "SymbolDisk", "check_name"]

log = logging.getLogger("mpl.worker")

_SUFFIX = ".sym"
_LOCKS = 64  # stripes: saves of different names rarely share one
CACHE_BYTES = 256 * 1024 * 1024  # loaded values kept in memory, at most
_CACHE_ENTRIES = 1024
_CORRUPT_MEMORY = 1024


class SymbolDisk:
    """Persisted values of one worker (see the module docstring)."""

    def __init__(self, root: Path, *, cache_bytes: int = CACHE_BYTES) -> None:
        self.dir = root / "symbols"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._locks = [threading.Lock() for _ in range(_LOCKS)]
        self._cache_lock = threading.Lock()
        self._cache: SizedLRU[str, Any] = SizedLRU(_CACHE_ENTRIES, cache_bytes)
        self.corrupt: LRU[str, str] = LRU(_CORRUPT_MEMORY)  # file name -> why it is unreadable
        self._index_lock = threading.Lock()
        self._index: dict[str, SymbolInfo] = {}  # what is on disk now: one entry per file
        self._sweep_temporaries()
        self.scan()

    # -- the three operations -------------------------------------------------------------
    def save(self, info: SymbolInfo, value: Any) -> None:
        """Write ``value`` under ``info.name``; the old value stays whole if this fails."""
        name = check_name(info.name)
        chunks = symbol_chunks(info, Lit(value))
        try:
            first = next(chunks)  # encodes everything: refusals come before any write
        except UnsafeValueError as exc:
            where = f"to disk (mp.save of {name!r} with persist=True)"
            raise unsafe(exc.type_name or "value", where) from None
        with self._lock(name):
            size = self._publish(name, [first, *chunks])
            self._drop_legacy(name)
            with self._cache_lock:
                self._cache.put(name, value, size)
            with self._index_lock:
                self._index[name] = info
            self.corrupt.pop(name + _SUFFIX, None)

    def load(self, name: str) -> Any:
        check_name(name)
        with self._cache_lock:
            if name in self._cache:
                return self._cache.get(name)
        with self._lock(name):  # not interleaved with a save: the cache never goes stale
            value, size = self._read(name)
            with self._cache_lock:
                self._cache.put(name, value, size)
        return value

    def delete(self, name: str) -> None:
        check_name(name)
        with self._lock(name):
            with self._cache_lock:
                self._cache.pop(name)
            for path in (self._path(name), *self._legacy(name)):
                path.unlink(missing_ok=True)
            self._sync_dir()
            with self._index_lock:
                self._index.pop(name, None)

    def infos(self) -> list[SymbolInfo]:
        """Descriptions of every value persisted here now (what a worker's hello lists, on
        every registration, so a restarted broker learns exactly the current names)."""
        with self._index_lock:
            return list(self._index.values())

    def scan(self) -> list[SymbolInfo]:
        """Read every description from disk afresh; unreadable files are reported (logged
        and counted), never hidden."""
        out: dict[str, SymbolInfo] = {}
        for path in sorted(self.dir.glob("*.info")):  # earlier releases' layout
            info = self._info(path, lambda p: loads(p.read_bytes()))
            if info is not None:
                out[info.name] = info
        for path in sorted(self.dir.glob("*" + _SUFFIX)):
            info = self._info(path, _read_head)
            if info is not None:
                out[info.name] = info
        with self._index_lock:
            self._index = out
        return list(out.values())

    def stats(self) -> dict[str, int]:
        return {"corrupt_files": len(self.corrupt), "symbol_cache_drops": self._cache.dropped}

    # -- files ----------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return self.dir / f"{name}{_SUFFIX}"

    def _legacy(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.info", self.dir / f"{name}.value"

    def _lock(self, name: str) -> threading.Lock:
        return self._locks[zlib.crc32(name.encode()) % _LOCKS]

    def _publish(self, name: str, chunks: list[Any]) -> int:
        tmp = self.dir / f".{name}.{secrets.token_hex(8)}.tmp"
        size = 0
        try:
            with open(tmp, "xb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    size += memoryview(chunk).nbytes
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(name))  # the one step that publishes
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise OSError(
                exc.errno,
                f"could not persist {name!r} under {self.dir.name}/: "
                f"{exc.strerror or exc}; the previous value (if any) is unchanged",
            ) from exc
        self._sync_dir()
        return size

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _drop_legacy(self, name: str) -> None:
        stale = [p for p in self._legacy(name) if p.exists()]
        for path in stale:
            path.unlink(missing_ok=True)
        if stale:
            self._sync_dir()

    def _read(self, name: str) -> tuple[Any, int]:
        path = self._path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return self._read_legacy(name)
        try:
            info, record = split_symbol(data)
            if not isinstance(info, SymbolInfo) or not isinstance(record, Lit):
                raise ProtocolError("the file does not hold a description and a value")
        except ProtocolError as exc:
            raise self._damaged(path, exc) from None
        return record.value, len(data)

    def _read_legacy(self, name: str) -> tuple[Any, int]:
        info_path, path = self._legacy(name)
        if not info_path.exists():
            raise SessionError(f"no value named {name!r} on this worker")
        try:
            data = path.read_bytes()
            record = loads(data)
            if not isinstance(record, Lit):
                raise ProtocolError("the file does not hold a value")
        except (OSError, ProtocolError) as exc:
            raise self._damaged(path, exc) from None
        return record.value, len(data)

    def _damaged(self, path: Path, exc: Exception) -> ProtocolError:
        self._report(path, str(exc))
        return ProtocolError(
            f"refusing to load the persisted value from {path}: {exc}. The file is damaged, "
            "or was written by an mpl from before its safe value format (pickles are never "
            "loaded): re-create the value and save it again, or delete the file"
        )

    def _info(self, path: Path, read: Any) -> SymbolInfo | None:
        try:
            info = read(path)
            if not isinstance(info, SymbolInfo):
                raise ProtocolError("the file does not start with a description")
            check_name(info.name)
            if path.stem != info.name:
                raise ProtocolError(f"the file describes {info.name!r}")
        except (OSError, ProtocolError, ValueError) as exc:
            self._report(path, str(exc))
            return None
        return info

    def _report(self, path: Path, why: str) -> None:
        if self.corrupt.get(path.name) != why:
            log.error("persisted value file %s is unreadable: %s", path, why)
        self.corrupt[path.name] = why

    def _sweep_temporaries(self) -> None:
        for tmp in self.dir.glob(".*.tmp"):  # a crash mid-save left it; never published
            tmp.unlink(missing_ok=True)


def _read_head(path: Path) -> Any:
    with open(path, "rb") as f:
        return read_symbol_head(f)
