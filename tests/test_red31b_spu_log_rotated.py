"""Second red team w31, finding B3: R7 refused the data root's ``spu.log`` to the file
kernels, but libspu's log rotates (spdlog, 500 MB a file, ten files): its older lines move
to ``spu.1.log`` ... ``spu.10.log`` beside it, the worker's log as much as ``spu.log``,
and read by every listed driver's ``read_csv`` as the operator's files are, quoted line by
line in its parse errors. Now those names are refused too, in any spelling.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpl.worker.kernel_table import KernelTable

_LINE = "[warning] lane payroll-2026~AbCdEfGh0123456789abcdef/SP0/x/1: recv timeout"


@pytest.mark.parametrize("per_driver", [True, False])
def test_a_driver_cannot_read_the_workers_rotated_spu_logs(
    tmp_path: Path, per_driver: bool
) -> None:
    for name in ("spu.1.log", "spu.10.log"):
        (tmp_path / name).write_text(f"{_LINE}\nsecond line\n")
    (tmp_path / "spu.notes.log").write_text("1,2\n")  # an operator's file of another name
    table = KernelTable(lambda: {}, root=tmp_path, per_driver=per_driver)
    read_csv = table.resolve("mpl.io.read_csv", "s", "driver:mallory")
    for path in ("spu.1.log", "SPU.10.LOG", "./spu.1.log", "spu.1.log."):
        with pytest.raises(PermissionError, match="SPU log"):
            read_csv(path, delimiter="\x01")
    assert read_csv("spu.notes.log").tolist() == [[1.0, 2.0]]
