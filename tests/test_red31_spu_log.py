"""Red team w31, finding R7: any listed driver read the worker's SPU log, line by line,
through the file kernels' errors.

A secure worker's file kernels read a driver's own folder first and fall back to the data
root itself (the operator's files, read by every driver). libspu's log is written there
too (``<data-root>/spu.log``, the worker's, no operator's file), and ``mpl.io.read_csv``
of a text file fails quoting the line it could not parse: with a delimiter no line holds
and ``skip_header=k``, a driver's job (``code: kernels`` included) reads line k of what the
worker's MPC runs logged, for every driver, and the broker reads it too (errors travel in
the clear). Now the data root's ``spu.log`` is refused to the file kernels, as ``symbols``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpl.worker.kernel_table import KernelTable

_LINE = "[warning] lane payroll-2026~AbCdEfGh0123456789abcdef/SP0/x/1: recv timeout"


def test_a_driver_cannot_read_the_workers_spu_log(tmp_path: Path) -> None:
    (tmp_path / "spu.log").write_text(f"{_LINE}\nsecond line\n")
    (tmp_path / "books.csv").write_text("1,2\n")  # the operator's file, for every driver
    table = KernelTable(lambda: {}, root=tmp_path, per_driver=True)
    read_csv = table.resolve("mpl.io.read_csv", "s", "driver:mallory")
    for path in ("spu.log", "SPU.LOG", "./spu.log"):
        with pytest.raises(PermissionError, match="SPU log"):
            read_csv(path, delimiter="\x01")
    assert read_csv("books.csv").tolist() == [[1.0, 2.0]]


def test_a_drivers_own_file_of_that_name_is_its_own(tmp_path: Path) -> None:
    import numpy as np

    table = KernelTable(lambda: {}, root=tmp_path, per_driver=True)
    table.resolve("mpl.io.write_csv", "s", "driver:alice")("spu.log", np.array([[3.0]]))
    got = table.resolve("mpl.io.read_csv", "s", "driver:alice")("spu.log")
    assert got.tolist() == [[3.0]]
    assert not (tmp_path / "spu.log").exists()
