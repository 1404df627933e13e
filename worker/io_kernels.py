"""mpl's own kernels: read and write ``.npy`` and CSV files under the worker's data root.

Registered as entry points (group ``mpl.kernels``) under the kernel ids ``mpl.io.read_npy``,
``mpl.io.write_npy``, ``mpl.io.read_csv`` and ``mpl.io.write_csv``; call them with
``mp.kernel("mpl.io.read_npy")`` or bind a logical name to them in ``op_bindings``.

Every path is relative to the worker's ``--data-root`` and must stay inside it: an absolute
path, a ``..`` part or a symbolic link at any part raises ``PermissionError``. A party thus
decides which files a program may touch by what it puts under its data root. The worker's
own ``symbols`` folder there (persisted values, ``mpl.worker.symbol_disk``) is out of
bounds too: only a value's owner replaces or deletes it, by its sealed jobs; and so is the
worker's SPU log there (``spu.log``), which is no operator's file.

No path is resolved and then opened by name (a link swapped in between would be followed):
the data root is opened once, as the operator gave it, and each part below it is opened
relative to its parent's descriptor with ``O_NOFOLLOW``, so a link is refused whenever it
appeared. A file read must be a regular file (a FIFO would block the job's thread), and on
a secure worker one of a single hard link (another link to it may lie in another driver's
folder: no driver's kernel makes one, but the operator's tools may). A write goes to a new
temporary file in the target's folder, renamed over the target when whole (so it never
writes through a link into another name's file).

On a secure worker each driver has a folder of its own, ``<data-root>/drivers/<name>``
(``kernel_table.driver_root``, by the driver that sealed the job): a job writes there, and
reads there first, so what one driver's job wrote no other driver's job reads or replaces.
A read of a path the driver's folder does not hold falls back to the data root itself,
outside ``drivers`` and ``symbols``: the operator's files, read (never written) by every
driver its spec lists. The operator places a file for one driver alone in that driver's
folder. A driver's folder holds at most the worker's ``--driver-quota`` bytes
(``kernel_table.driver_quota``; each file and folder counted by its size rounded up to
4 KiB blocks): a write that would pass it raises :class:`DriverQuotaError` and leaves
nothing behind. A plaintext worker (drivers not authenticated) reads and writes the data
root itself, for every driver, as before, without a quota.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from mpl.worker.kernel_table import (
    DEFAULT_DRIVER_QUOTA,
    DRIVERS,
    SPU_LOG,
    data_root,
    driver_quota,
    driver_root,
)
from mpl.worker.symbol_disk import SYMBOLS

__all__ = [
    "BLOCK",
    "DEFAULT_DRIVER_QUOTA",
    "MAX_CSV_DELIMITER",
    "MAX_PATH_PARTS",
    "DriverQuotaError",
    "read_csv",
    "read_npy",
    "write_csv",
    "write_npy",
]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: an open of a FIFO for reading would wait for a writer; the file is checked
# to be a regular one before it is read
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NPY_MAGIC = b"\x93NUMPY"  # how every .npy file starts (numpy.lib.format)
MAX_CSV_DELIMITER = 16  # characters: see write_csv
MAX_PATH_PARTS = 64  # folders a path may name: bounds the depth a quota count walks
BLOCK = 4096  # a file system's usual block: what an empty file or a folder takes at least
_ROOT_WHERE = "the worker's data root"
# What no file kernel reaches at the data root, by any spelling: persisted values (their
# owners' alone), the drivers' own folders, and the worker's SPU log (a driver's read_csv of
# it, its lines quoted by a parse's errors, would read out what the worker's MPC runs logged)
_RESERVED = {
    SYMBOLS: "the worker's persisted values' folder",
    DRIVERS: "the drivers' folders, each its driver's alone",
    SPU_LOG: "the worker's SPU log",
}
_OWN_WHERE = "this driver's folder"
# libspu's log rotates (spdlog: past 500 MB, ``spu.log`` becomes ``spu.1.log``, up to
# ``spu.10.log``): each old file is the worker's log as much as the one being written
_SPU_LOGS = re.compile(r"spu(?:\.\d+)?\.log\Z")


class DriverQuotaError(OSError):
    """A write kernel's file would take its driver's folder past the worker's byte quota
    (``mpl-worker --driver-quota``); nothing of it was kept."""


def _parts(path: str) -> list[str]:
    """``path``'s parts below its folder: relative, no ``..``, at most MAX_PATH_PARTS."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"a path must be a non-empty string, got {path!r}")
    if "\0" in path:
        raise ValueError(f"{path!r}: a path holds no NUL character")
    if path.startswith("/") or os.path.isabs(path):
        raise PermissionError(f"{path!r}: paths are relative to the worker's data root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PermissionError(f"{path!r}: a '..' part may lead outside the worker's data root")
    if not parts:
        raise PermissionError(f"{path!r} names no file")
    if len(parts) > MAX_PATH_PARTS:
        raise PermissionError(f"{path!r} has more than {MAX_PATH_PARTS} parts")
    return parts


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _link_refused(path: str, part: str, where: str) -> PermissionError:
    return PermissionError(
        f"{path!r}: {part!r} is a symbolic link, which the file kernels never follow "
        f"(it could lead outside {where})"
    )


def _open_dir(dir_fd: int, name: str, path: str, where: str, create: bool) -> tuple[int, bool]:
    """(the folder ``name`` in ``dir_fd`` opened without following a link, whether this
    call made it). Missing: made when ``create``, else FileNotFoundError."""
    made = False
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
            made = True
        except FileExistsError:
            pass
    try:
        return os.open(name, _DIR, dir_fd=dir_fd), made
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(dir_fd, name):
            raise _link_refused(path, name, where) from None
        if exc.errno == errno.ENOTDIR:  # a file where a folder is named: no such file
            raise FileNotFoundError(errno.ENOENT, f"{path!r}: {name!r} is not a folder") from None
        raise


def _walk(
    start: int,
    names: Sequence[str],
    path: str,
    where: str,
    made: list[str] | None = None,
    below: Sequence[str] = (),
) -> int:
    """A new descriptor of the folder ``names`` below ``start`` (``start`` stays open),
    each part opened by its parent's descriptor; with ``made`` (a write), missing folders
    are made and their paths (below the data root: ``start`` is ``below`` there) added to
    it as they are made."""
    fd = os.dup(start)
    try:
        for n, name in enumerate(names):
            child, new = _open_dir(fd, name, path, where, made is not None)
            os.close(fd)
            fd = child
            if new and made is not None:
                made.append("/".join([*below, *names[: n + 1]]))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_root() -> int:
    """The data root, opened as the operator gave it (it may itself be a link)."""
    return os.open(data_root(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _own_parts() -> tuple[str, ...]:
    """The job's driver's folder below the data root: ``("drivers", name)`` on a secure
    worker, ``()`` on a plaintext one (one folder, the data root, for every driver)."""
    return driver_root().relative_to(data_root()).parts


def _refuse_reserved(root_fd: int, parts: list[str], path: str, folders: Sequence[str]) -> None:
    """Refuse a path at the data root whose first part is one of ``folders`` by any name a
    file system may take for it: casefolded (a case-insensitive file system reads
    ``Drivers`` or ``driver\u017f`` as ``drivers``; Windows drops a trailing dot or
    space), or the same folder on disk."""
    first = parts[0]
    spelled = first.rstrip(". ").casefold()
    for folder in folders:
        what = _RESERVED[folder]
        if spelled == folder.casefold() or (folder == SPU_LOG and _SPU_LOGS.match(spelled)):
            raise PermissionError(f"{path!r} is in {what}")
        try:
            mine = os.stat(first, dir_fd=root_fd, follow_symlinks=False)
            theirs = os.stat(folder, dir_fd=root_fd, follow_symlinks=False)
        except OSError:  # either is missing: nothing of the folder's is read through it
            continue
        if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
            raise PermissionError(f"{path!r} is in {what}")


def _open_file(folder: int, parts: list[str], path: str, where: str, one_link: bool = False) -> int:
    """A descriptor of the regular file ``parts`` below ``folder``, read only; with
    ``one_link`` (a secure worker's) a file of more than one hard link is refused: its
    other names may lie in another driver's folder (no driver's kernel makes a link, but
    an operator's tool may: ``cp -al``, a backup, a kernel of its own), and the file read
    through this one would be that driver's."""
    parent = _walk(folder, parts[:-1], path, where)
    try:
        fd = os.open(parts[-1], _READ, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_refused(path, parts[-1], where) from None
        raise
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path!r} is not a regular file")
        if one_link and st.st_nlink > 1:
            raise PermissionError(
                f"{path!r} has {st.st_nlink} hard links (a secure worker reads a file of one "
                "only: another could be in another driver's folder); its operator copies it"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_readable(path: str) -> int:
    """A read-only descriptor of ``path``: the driver's own file, else the operator's."""
    parts = _parts(path)
    root = _open_root()
    try:
        own = _own_parts()
        if not own:  # plaintext: one folder for every driver
            _refuse_reserved(root, parts, path, (SYMBOLS, SPU_LOG))
            return _open_file(root, parts, path, _ROOT_WHERE)
        try:
            folder: int | None = _walk(root, own, path, _OWN_WHERE)
        except FileNotFoundError:  # no folder yet: nothing of its own to read
            folder = None
        if folder is not None:
            try:
                return _open_file(folder, parts, path, _OWN_WHERE, one_link=True)
            except FileNotFoundError:
                pass  # not the driver's: the operator's files, read by every driver
            finally:
                os.close(folder)
        _refuse_reserved(root, parts, path, (SYMBOLS, DRIVERS, SPU_LOG))
        return _open_file(root, parts, path, _ROOT_WHERE, one_link=True)
    finally:
        os.close(root)


def _charge(nbytes: int) -> int:
    """What a file of ``nbytes`` (or a folder) counts against a quota: whole blocks, one
    at least."""
    return max(1, -(-nbytes // BLOCK)) * BLOCK


def _usage(folder: int, limit: int) -> int:
    """The bytes ``folder``'s files and folders count against its quota (links are not
    followed; each entry is counted as :func:`_charge` says), or some count past ``limit``:
    the walk stops there, so a folder the operator filled with a million files costs at
    most limit / BLOCK stats."""
    total = 0
    for _, dirs, files, fd in os.fwalk(".", dir_fd=folder, follow_symlinks=False):
        total += BLOCK * len(dirs)
        if total > limit:  # (before its folders are walked in turn)
            return total
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += _charge(os.stat(name, dir_fd=fd, follow_symlinks=False).st_size)
            if total > limit:
                return total
    return total


# Each driver's folder's count, kept from one write to the next under the folder's
# _writing lock: a write walks the folder only when it has no count, the count refuses it
# (files the operator removed free their room then) or the folder is not as the last
# write left it, not at every write (a walk stats every file: up to quota / BLOCK).
# By the folder's (st_dev, st_ino), with its st_ctime_ns after that write: a folder
# removed and made anew may get the same inode number, never the same change time.
_COUNTED: dict[tuple[int, int], tuple[int, int]] = {}


class _Capped:
    """A binary file that refuses to grow past ``room`` bytes (as :func:`_charge` counts)."""

    def __init__(self, raw: Any, room: int | None, refusal: Callable[[], DriverQuotaError]) -> None:
        self.raw = raw
        self.room = room
        self.written = 0
        self._refusal = refusal

    def write(self, data: Any) -> int:
        nbytes = memoryview(data).nbytes  # TypeError for a str: numpy then writes bytes
        if self.room is not None and _charge(self.written + nbytes) > self.room:
            raise self._refusal()
        self.written += nbytes
        written: int = self.raw.write(data)
        return written

    def flush(self) -> None:
        self.raw.flush()


_LOCKS_GUARD = threading.Lock()
_LOCKS: dict[tuple[str, ...], threading.Lock] = {}  # one per driver's folder (spec-bound)


@contextlib.contextmanager
def _writing(own: tuple[str, ...]) -> Iterator[None]:
    """One write at a time per folder, so that a quota's count and the write it allows
    are not raced by another of the driver's jobs."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(own, threading.Lock())
    with lock:
        yield


def _write(path: str, dump: Callable[[Any], None]) -> str:
    """Write ``path`` in the job's driver's folder (the data root in plaintext) through
    ``dump(file)``: into a new file beside it, renamed over it once whole; on any failure
    (the quota among them) neither that file nor a folder this write made is left."""
    parts = _parts(path)
    os.makedirs(data_root(), exist_ok=True)  # the operator's folder, made as before
    root = _open_root()
    try:
        own = _own_parts()
        if not own:
            _refuse_reserved(root, parts, path, (SYMBOLS, SPU_LOG))
        where = _OWN_WHERE if own else _ROOT_WHERE
        quota = driver_quota() if own else 0
        with _writing(own):
            made: list[str] = []  # folders this write made, below the data root
            folder = _walk(root, own, path, where, made)
            try:
                _write_in(folder, parts, path, where, quota, own, made, dump)
            except BaseException:
                for sub in reversed(made):  # innermost first; empty, as the write failed
                    if sub == DRIVERS:  # every driver's: another's write may be in it
                        continue
                    with contextlib.suppress(OSError):
                        os.rmdir(sub, dir_fd=root)
                raise
            finally:
                os.close(folder)
    finally:
        os.close(root)
    return path


def _write_in(
    folder: int,
    parts: list[str],
    path: str,
    where: str,
    quota: int,
    own: tuple[str, ...],
    made: list[str],
    dump: Callable[[Any], None],
) -> None:
    before = len(made)
    here = os.fstat(folder)  # before this write makes a folder in it
    parent = _walk(folder, parts[:-1], path, where, made, own)
    name = parts[-1]
    try:
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise PermissionError(f"{path!r} is a folder, not a file to write")

        def refusal() -> DriverQuotaError:
            return DriverQuotaError(
                errno.EDQUOT,
                f"{path!r}: writing it would take driver {own[-1]}'s folder past its quota "
                f"of {quota} bytes (mpl-worker --driver-quota); nothing was written",
            )

        if quota <= 0:
            _put(parent, name, None, refusal, dump)
            return
        replaced = _charge(old.st_size) if old is not None else 0
        key = (here.st_dev, here.st_ino)
        last = _COUNTED.get(key)
        kept = last[1] if last is not None and last[0] == here.st_ctime_ns else None
        new_folders = BLOCK * (len(made) - before)  # removed again if the write fails
        used = _usage(folder, quota) if kept is None else kept + new_folders
        try:
            written = _put(parent, name, quota - (used - replaced), refusal, dump)
        except DriverQuotaError:
            recount = used if kept is None else _usage(folder, quota)
            _COUNTED[key] = (here.st_ctime_ns, recount - new_folders)
            if recount >= used:
                raise
            used = recount  # the operator removed files since the count: room again
            written = _put(parent, name, quota - (used - replaced), refusal, dump)
        _COUNTED[key] = (os.fstat(folder).st_ctime_ns, used - replaced + _charge(written))
    finally:
        os.close(parent)


def _put(
    parent: int,
    name: str,
    room: int | None,
    refusal: Callable[[], DriverQuotaError],
    dump: Callable[[Any], None],
) -> int:
    """Write ``name`` in ``parent`` through ``dump`` into a new file, renamed over it once
    whole, in at most ``room`` bytes (None: any); the bytes written."""
    if room is not None and room < BLOCK:
        raise refusal()
    temp = f".mpl-write.{secrets.token_hex(8)}.part"  # a new name: O_EXCL makes it
    fd = os.open(temp, _NEW, 0o644, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            capped = _Capped(raw, room, refusal)
            dump(capped)
        os.replace(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise
    return capped.written


def read_npy(path: str) -> Any:
    """The array stored in ``path``, a .npy file (no pickled objects, no .npz archive:
    a driver can write any bytes through ``write_csv``'s header, and a zip's deflated
    members would expand about a thousand times in memory)."""
    with os.fdopen(_open_readable(path), "rb") as f:
        if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            raise ValueError(f"{path!r} is not a .npy file")
        f.seek(0)
        return np.load(f, allow_pickle=False)


def write_npy(path: str, array: Any) -> str:
    """Store ``array`` in ``path`` (parent folders are made); returns ``path``."""
    value = np.asarray(array)
    return _write(path, lambda f: np.save(f, value, allow_pickle=False))


def read_csv(path: str, *, delimiter: str = ",", skip_header: int = 0) -> Any:
    """A numeric CSV file as a 2-D float array (``skip_header`` lines skipped)."""
    with os.fdopen(_open_readable(path), "rb") as f:
        return np.loadtxt(f, delimiter=delimiter, skiprows=skip_header, ndmin=2, dtype=np.float64)


def write_csv(path: str, array: Any, *, delimiter: str = ",", header: str = "") -> str:
    """Store a 1-D or 2-D numeric array as CSV in ``path``; returns ``path``. The
    delimiter is at most MAX_CSV_DELIMITER characters."""
    # np.savetxt builds each row in memory, the delimiter between every two columns,
    # before the quota sees a byte of it: a long delimiter would multiply a row's size
    if len(delimiter) > MAX_CSV_DELIMITER:
        raise ValueError(
            f"a CSV delimiter is at most {MAX_CSV_DELIMITER} characters, got {len(delimiter)}"
        )
    value = np.asarray(array)
    return _write(
        path, lambda f: np.savetxt(f, value, delimiter=delimiter, header=header, comments="")
    )
