"""Review w30 of the per-driver code policy, the drivers' file folders and the fetch-reply
fix: attacks as a ``code: kernels`` driver (or a broker holding its key) and as another
listed driver. Each test fails while its attack works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpl.wire import ClusterSpec
from mpl.wire.errors import ClusterSpecError
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


def test_a_spec_lists_no_two_drivers_whose_names_differ_only_by_case() -> None:
    """Finding 2 (low: a case-insensitive file system, and an operator listing, say, its
    own ``analyst`` beside another organisation's ``Analyst``). Each secure driver's files
    live in ``<data-root>/drivers/<name>``: there both names are one folder, so each
    driver's jobs read and replace the other's files. Fixed: such a spec is refused."""
    keys = [
        "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
        "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6",
        "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID",
        "Op9jC:9Nw]ZtHw9Sd^?aD.L(0Mlk+@RW%U/x?fh5",
    ]
    data = {
        "broker": {"curve_key": keys[0]},
        "nodes": [{"name": "n0", "curve_key": keys[1]}],
        "devices": {"P0": {"kind": "PPU", "members": ["n0"]}},
        "drivers": [
            {"name": "analyst", "curve_key": keys[2]},
            {"name": "Analyst", "curve_key": keys[3], "code": "kernels"},
        ],
    }
    with pytest.raises(ClusterSpecError, match=r"drivers\[1\]\.name: duplicate"):
        ClusterSpec.from_dict(data)
