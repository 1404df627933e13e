"""Review w30 of the per-driver code policy, the drivers' file folders and the fetch-reply
fix: attacks as a ``code: kernels`` driver (or a broker holding its key) and as another
listed driver. Each test fails while its attack works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpl.worker.kernel_table import KernelTable

__all__: list[str] = []


def _runner(root: Path) -> Any:
    table = KernelTable(lambda: {}, root=root, per_driver=True)

    def run(driver: str, kernel: str, *args: Any) -> Any:
        return table.resolve(kernel, "s", f"driver:{driver}")(*args)

    return run


@pytest.mark.parametrize("folder", ["Drivers", "DRIVERS", "driver\u017f", "Symbols", "SYMBOLS"])
def test_a_read_falls_back_to_no_other_spelling_of_the_drivers_or_symbols_folder(
    tmp_path: Path, folder: str
) -> None:
    """Finding 1 (medium on a case-insensitive file system: macOS's APFS and HFS+, Windows;
    none on Linux's usual ones). A read the driver's folder does not hold falls back to the
    data root, refused into ``drivers`` and ``symbols`` by comparing resolved paths, which
    keep the case a job wrote: where ``Drivers/analyst/out.npy`` is the file
    ``drivers/analyst/out.npy`` (a file system that folds case, ``\u017f`` to ``s`` too),
    mallory's ``read_npy("Drivers/analyst/out.npy")`` read the analyst's file. Here a
    folder of that other spelling stands for what such a file system shows there.

    Fixed: the fallback refuses a path whose first part below the data root is either
    folder by any spelling (casefolded), or the same folder on disk."""
    run = _runner(tmp_path)
    theirs = tmp_path / folder / "analyst"
    theirs.mkdir(parents=True)
    np.save(theirs / "out.npy", np.array([4.0, 2.0]))
    with pytest.raises(PermissionError):
        run("mallory", "mpl.io.read_npy", f"{folder}/analyst/out.npy")
    (tmp_path / "books.csv").write_text("1,2\n")  # the operator's files still read
    assert run("mallory", "mpl.io.read_csv", "books.csv").tolist() == [[1.0, 2.0]]
