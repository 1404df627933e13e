"""mpl's own kernels: read and write ``.npy`` and CSV files under the worker's data root.

Registered as entry points (group ``mpl.kernels``) under the kernel ids ``mpl.io.read_npy``,
``mpl.io.write_npy``, ``mpl.io.read_csv`` and ``mpl.io.write_csv``; call them with
``mp.kernel("mpl.io.read_npy")`` or bind a logical name to them in ``op_bindings``.

Every path is relative to the worker's ``--data-root`` and must stay inside it: an absolute
path, ``..`` or a symbolic link leading out raises ``PermissionError``. A party thus decides
which files a program may touch by what it puts under its data root. The worker's own
``symbols`` folder there (persisted values, ``mpl.worker.symbol_disk``) is out of bounds
too: only a value's owner replaces or deletes it, by its sealed jobs; and so is the worker's
SPU log there (``spu.log``), which is no operator's file.

On a secure worker each driver has a folder of its own, ``<data-root>/drivers/<name>``
(``kernel_table.driver_root``, by the driver that sealed the job): a job writes there, and
reads there first, so what one driver's job wrote no other driver's job reads or replaces.
A read of a path the driver's folder does not hold falls back to the data root itself,
outside ``drivers`` and ``symbols``: the operator's files, read (never written) by every
driver its spec lists. The operator places a file for one driver alone in that driver's
folder. A plaintext worker (drivers not authenticated) reads and writes the data root
itself, for every driver, as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mpl.worker.kernel_table import DRIVERS, SPU_LOG, data_root, driver_root
from mpl.worker.symbol_disk import SYMBOLS

__all__ = ["read_csv", "read_npy", "write_csv", "write_npy"]


def _inside(base: Path, path: str, root: Path) -> Path:
    """``path`` under ``base`` (resolved), refused if it leads out of ``base`` or into the
    data root ``root``'s persisted values."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"a path must be a non-empty string, got {path!r}")
    if Path(path).is_absolute():
        raise PermissionError(f"{path!r}: paths are relative to the worker's data root")
    target = (base / path).resolve()
    if not target.is_relative_to(base):
        where = "the worker's data root" if base == root else "this driver's folder"
        raise PermissionError(f"{path!r} leads outside {where}")
    if _under(root, target, SYMBOLS):  # persisted values: their owners' alone
        raise PermissionError(f"{path!r} is in the worker's persisted values' folder")
    # the worker's own SPU log: no operator's file (a driver's read_csv of it, its lines
    # quoted by the errors of a parse, read out what the worker's MPC runs logged)
    if _under(root, target, SPU_LOG):
        raise PermissionError(f"{path!r} is the worker's SPU log")
    return target


def _under(root: Path, target: Path, folder: str) -> bool:
    """Whether ``target`` (resolved) is in the data root's ``folder`` by any name a file
    system may take for it: its first part below ``root`` casefolded (a case-insensitive
    file system reads ``Drivers`` or ``driver\u017f`` as ``drivers``; Windows drops a
    trailing dot or space), or the same folder on disk (a short name, say)."""
    if not target.is_relative_to(root):
        return False
    parts = target.relative_to(root).parts
    if not parts:
        return False
    first = parts[0]
    if first.rstrip(". ").casefold() == folder.casefold():
        return True
    try:
        return os.path.samefile(root / first, root / folder)
    except OSError:  # either is missing: nothing of the folder's is read through it
        return False


def _roots() -> tuple[Path, Path]:
    """(the data root, the job's driver's folder: the data root itself in plaintext)."""
    return data_root().resolve(), driver_root().resolve()


def _writable(path: str) -> Path:
    root, own = _roots()
    return _inside(own, path, root)


def _readable(path: str) -> Path:
    root, own = _roots()
    if own == root:  # plaintext: one folder for every driver
        return _inside(root, path, root)
    mine = _inside(own, path, root)
    if mine.exists():
        return mine
    shared = _inside(root, path, root)  # the operator's files, read by every driver
    if _under(root, shared, DRIVERS):
        raise PermissionError(f"{path!r} is in the drivers' folders, each its driver's alone")
    return shared


def read_npy(path: str) -> Any:
    """The array stored in ``path`` (no pickled objects: ``allow_pickle=False``)."""
    return np.load(_readable(path), allow_pickle=False)


def write_npy(path: str, array: Any) -> str:
    """Store ``array`` in ``path`` (parent folders are made); returns ``path``."""
    target = _writable(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as f:  # a file object: np.save would append ".npy" to a name
        np.save(f, np.asarray(array), allow_pickle=False)
    return path


def read_csv(path: str, *, delimiter: str = ",", skip_header: int = 0) -> Any:
    """A numeric CSV file as a 2-D float array (``skip_header`` lines skipped)."""
    return np.loadtxt(
        _readable(path), delimiter=delimiter, skiprows=skip_header, ndmin=2, dtype=np.float64
    )


def write_csv(path: str, array: Any, *, delimiter: str = ",", header: str = "") -> str:
    """Store a 1-D or 2-D numeric array as CSV in ``path``; returns ``path``."""
    target = _writable(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(target, np.asarray(array), delimiter=delimiter, header=header, comments="")
    return path
