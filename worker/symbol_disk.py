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

A secure worker writes each file with its owner, the driver whose sealed job saved it,
and reads, replaces or deletes it only as ``mpl.worker.symbol_owner`` says: the owner is
kept with the value, in its file (read again after a restart) and in this process's index
and cache, never taken from anything the broker relays. To any other driver the value is
none at all: its reads and deletes answer as for a name nothing is persisted under.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import zlib
from pathlib import Path
from typing import Any

from mpl.wire.errors import ProtocolError, SessionAccessError, SessionError, UnsafeValueError
from mpl.wire.jobs import Lit
from mpl.wire.limits import check_symbol_name as check_name
from mpl.wire.lru import LRU, SizedLRU
from mpl.wire.persist import loads, read_owned_head, split_owned_symbol, symbol_chunks
from mpl.wire.safe_values import unsafe
from mpl.wire.sessions import SymbolInfo
from mpl.worker.symbol_owner import hidden, refuse_read, refuse_write

__all__ = ["CACHE_BYTES", "SYMBOLS", "SymbolDisk", "check_name"]

log = logging.getLogger("mpl.worker")

SYMBOLS = "symbols"  # the folder under the data root (the file kernels stay out of it)
_SUFFIX = ".sym"
_LOCKS = 64  # stripes: saves of different names rarely share one
CACHE_BYTES = 256 * 1024 * 1024  # loaded values kept in memory, at most
_CACHE_ENTRIES = 1024
_CORRUPT_MEMORY = 1024


class SymbolDisk:
    """Persisted values of one worker (see the module docstring)."""

    def __init__(self, root: Path, *, cache_bytes: int = CACHE_BYTES) -> None:
        self.dir = root / SYMBOLS
        self.dir.mkdir(parents=True, exist_ok=True)
        self._locks = [threading.Lock() for _ in range(_LOCKS)]
        self._cache_lock = threading.Lock()
        # name -> (value, its owner or ""), as loaded or saved
        self._cache: SizedLRU[str, tuple[Any, str]] = SizedLRU(_CACHE_ENTRIES, cache_bytes)
        self.corrupt: LRU[str, str] = LRU(_CORRUPT_MEMORY)  # file name -> why it is unreadable
        self._index_lock = threading.Lock()
        # what is on disk now, one entry per file: its description and owner ("": none)
        self._index: dict[str, tuple[SymbolInfo, str]] = {}
        self._sweep_temporaries()
        self.scan()

    # -- the three operations -------------------------------------------------------------
    def save(self, info: SymbolInfo, value: Any, owner: str | None = None) -> None:
        """Write ``value`` under ``info.name``, owned by ``owner`` (a secure worker's sealed
        job's driver; None: a plaintext worker's, no owner); the old value stays whole if
        this fails, or if ``owner`` may not replace it (``SessionAccessError``)."""
        name = check_name(info.name)
        if owner == "":
            raise SessionAccessError(f"persisting {name!r}: no driver sealed the save")
        chunks = symbol_chunks(info, Lit(value), owner or "")
        try:
            first = next(chunks)  # encodes everything: refusals come before any write
        except UnsafeValueError as exc:
            where = f"to disk (mp.save of {name!r} with persist=True)"
            raise unsafe(exc.type_name or "value", where) from None
        with self._lock(name):
            self._may_write(name, owner)
            size = self._publish(name, [first, *chunks])
            self._drop_legacy(name)
            with self._cache_lock:
                self._cache.put(name, (value, owner or ""), size)
            with self._index_lock:
                self._index[name] = (info, owner or "")
            self.corrupt.pop(name + _SUFFIX, None)

    def load(self, name: str, reader: str | None = None) -> Any:
        """The value persisted as ``name``, read in a session bound here to ``reader`` (a
        secure worker's: "" for none; None: a plaintext worker's, no rule).

        Another driver's value is no value to ``reader`` (``symbol_owner.hidden``): refused
        by the same ``SessionError``, raised from the same line, as a name nothing is
        persisted under, so the answer (its traceback too) differs only by the name. The
        index (or, for a name it lacks, the head of the file its path opens: another name's
        on a file system that folds case, ``_other_owner``) says whose a file is without
        reading its value: another driver's value is neither read nor cached for this
        reader."""
        check_name(name)
        with self._cache_lock:
            held = self._cache.get(name)
        if held is None and not hidden(self._owner(name), reader):
            with self._lock(name):  # not interleaved with a save: the cache never goes stale
                read = self._read(name)
                if read is not None:
                    value, owner, size = read
                    held = (value, owner)
                    with self._cache_lock:
                        self._cache.put(name, held, size)
        if held is None or hidden(held[1], reader):
            raise SessionError(f"no value named {name!r} on this worker")
        refused = refuse_read(name, held[1], reader)
        if refused:
            raise SessionAccessError(refused)
        return held[0]

    def delete(self, name: str, by: str | None = None) -> None:
        """Delete what is persisted as ``name``, by ``by`` (a secure worker's sealed job's
        driver, or "": the broker's word; None: a plaintext worker's, no rule). Another
        driver's value is none of ``by``'s (``symbol_owner.hidden``): left whole, answered
        as a name nothing is persisted under (there is nothing of ``by``'s to delete)."""
        check_name(name)
        with self._lock(name):
            if hidden(self._owner(name), by):
                return
            self._may_write(name, by)
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
            return [info for info, _ in self._index.values()]

    def hello_lists(self) -> tuple[list[SymbolInfo], dict[str, str]]:
        """:meth:`infos` and, taken with them, whose each is (name -> owner, for the files
        that record one): a worker's hello lists both, so that a secure broker lists each
        name to its owner alone."""
        with self._index_lock:
            infos = [info for info, _ in self._index.values()]
            owners = {name: owner for name, (_, owner) in self._index.items() if owner}
        return infos, owners

    def scan(self) -> list[SymbolInfo]:
        """Read every description from disk afresh; unreadable files are reported (logged
        and counted), never hidden."""
        out: dict[str, tuple[SymbolInfo, str]] = {}
        for path in sorted(self.dir.glob("*.info")):  # earlier releases' layout: no owner
            read = self._info(path, lambda p: (loads(p.read_bytes()), ""))
            if read is not None:
                out[read[0].name] = read
        for path in sorted(self.dir.glob("*" + _SUFFIX)):
            read = self._info(path, _read_head)
            if read is not None:
                out[read[0].name] = read
        with self._index_lock:
            self._index = out
        return [info for info, _ in out.values()]

    def stats(self) -> dict[str, int]:
        return {"corrupt_files": len(self.corrupt), "symbol_cache_drops": self._cache.dropped}

    # -- files ----------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return self.dir / f"{name}{_SUFFIX}"

    def _legacy(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.info", self.dir / f"{name}.value"

    def _may_write(self, name: str, writer: str | None) -> None:
        """Refuse (``SessionAccessError``) ``writer`` replacing or deleting ``name`` (its
        lock held): the index says whose file is there."""
        refused = refuse_write(name, self._owner(name), writer)
        if refused:
            raise SessionAccessError(refused)

    def _owner(self, name: str) -> str | None:
        """Whose file ``name``'s path opens (None: none; "": no owner recorded), by the
        index, or by the file another name's index entry stands for (``_other_owner``)."""
        with self._index_lock:
            held = self._index.get(name)
        return held[1] if held is not None else self._other_owner(name)

    def _other_owner(self, name: str) -> str | None:
        """The owner of the file that ``name``'s path opens though the index holds no
        ``name`` (None: no such file, or one that does not read): on a case-insensitive file
        system (macOS's, Windows') ``report.sym`` opens ``Report.sym``, another name's file,
        which a save or delete of ``report`` would replace or remove by its index entry's
        absence alone (red team w31, R4)."""
        path = self._path(name)
        if not path.exists():
            return None
        try:
            info, owner = _read_head(path)
        except (OSError, ProtocolError, ValueError):
            return None  # damaged (reported when read): as before, replaced by a save
        if not isinstance(info, SymbolInfo) or info.name == name:
            return None  # this name's own file the index does not list: as before
        return owner

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

    def _read(self, name: str) -> tuple[Any, str, int] | None:
        """The value persisted as ``name``, its owner ("": none) and its file's size; None
        if there is none."""
        path = self._path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            legacy = self._read_legacy(name)
            return None if legacy is None else (legacy[0], "", legacy[1])
        try:
            info, record, owner = split_owned_symbol(data)
            if not isinstance(info, SymbolInfo) or not isinstance(record, Lit):
                raise ProtocolError("the file does not hold a description and a value")
        except ProtocolError as exc:
            raise self._damaged(path, exc) from None
        return record.value, owner, len(data)

    def _read_legacy(self, name: str) -> tuple[Any, int] | None:
        info_path, path = self._legacy(name)
        if not info_path.exists():
            return None
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

    def _info(self, path: Path, read: Any) -> tuple[SymbolInfo, str] | None:
        try:
            info, owner = read(path)
            if not isinstance(info, SymbolInfo):
                raise ProtocolError("the file does not start with a description")
            check_name(info.name)
            if path.stem != info.name:
                raise ProtocolError(f"the file describes {info.name!r}")
        except (OSError, ProtocolError, ValueError) as exc:
            self._report(path, str(exc))
            return None
        return info, owner

    def _report(self, path: Path, why: str) -> None:
        if self.corrupt.get(path.name) != why:
            log.error("persisted value file %s is unreadable: %s", path, why)
        self.corrupt[path.name] = why

    def _sweep_temporaries(self) -> None:
        for tmp in self.dir.glob(".*.tmp"):  # a crash mid-save left it; never published
            tmp.unlink(missing_ok=True)


def _read_head(path: Path) -> tuple[Any, str]:
    with open(path, "rb") as f:
        return read_owned_head(f)
