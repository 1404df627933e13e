"""Red team w31, finding R4: on a case-insensitive file system another driver replaced or
deleted an owned persisted value by saving or deleting its name in another case.

A secure worker lets only a value's owner replace or delete it, and asks its index whose
file a name's is. The index is keyed by the name as written, the file system by the name
as it folds it: on macOS's or Windows' default file systems ``report.sym`` opens
``Report.sym``. So mallory's sealed ``save`` of ``report`` found no index entry, and
replaced the analyst's ``Report`` with a value of mallory's (the analyst's reads of it
then refused: another driver's file); its ``unsave`` of ``report`` removed it. Now a name
missing from the index whose path opens another name's file is that file's owner's.

This machine's file system tells case apart, so the disk here folds names as one that does
not would (its path for a name is the lower-cased name's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpl.wire.errors import SessionAccessError, SessionError
from mpl.wire.sessions import SymbolInfo
from mpl.worker.symbol_disk import SymbolDisk

A, M = "driver:analyst", "driver:mallory"


class CaseFoldingDisk(SymbolDisk):
    """A :class:`SymbolDisk` on a file system that opens a name in any case as one file."""

    def _path(self, name: str) -> Path:
        return super()._path(name.lower())


def _info(name: str) -> SymbolInfo:
    return SymbolInfo(name, "P0", (0,), True, {})


@pytest.fixture
def disk(tmp_path: Path) -> CaseFoldingDisk:
    """A case-folding disk holding the analyst's ``Report`` (0, 1, 2)."""
    made = CaseFoldingDisk(tmp_path)
    made.save(_info("Report"), np.arange(3.0), A)
    return made


def test_another_driver_cannot_replace_an_owned_value_by_its_name_in_another_case(
    disk: CaseFoldingDisk, tmp_path: Path
) -> None:
    with pytest.raises(SessionAccessError, match="another driver"):
        disk.save(_info("report"), np.zeros(3), M)
    again = CaseFoldingDisk(tmp_path)  # (no cache: what the file holds)
    assert again.load("Report", A).tolist() == [0.0, 1.0, 2.0]


def test_another_driver_cannot_delete_an_owned_value_by_its_name_in_another_case(
    disk: CaseFoldingDisk, tmp_path: Path
) -> None:
    # (since w32-trust another driver's value is none of mallory's: its delete answers as
    # for a free name, and deletes nothing)
    disk.delete("REPORT", M)
    assert CaseFoldingDisk(tmp_path).load("Report", A).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(SessionAccessError, match="only by its owner"):
        disk.delete("REPORT", "")  # nor does the broker's word
    assert CaseFoldingDisk(tmp_path).load("Report", A).tolist() == [0.0, 1.0, 2.0]


def test_the_owner_still_replaces_and_deletes_its_own_value(disk: CaseFoldingDisk) -> None:
    disk.save(_info("Report"), np.ones(2), A)
    assert disk.load("Report", A).tolist() == [1.0, 1.0]
    disk.save(_info("other"), np.ones(1), M)  # a name no file of another holds
    disk.delete("Report", A)
    assert [i.name for i in disk.infos()] == ["other"]


def test_another_drivers_load_in_another_case_reads_and_keeps_nothing(tmp_path: Path) -> None:
    """(review of w32-trust) Mallory's load of ``report`` found no index entry, so the disk
    read the file its path opens, the analyst's ``Report``, and cached its value under
    ``report`` before refusing it: a read of another driver's value the index could have
    refused unread, and a stale copy the analyst's own later load of ``report`` returned
    after ``Report`` was saved again."""
    disk = CaseFoldingDisk(tmp_path)
    disk.save(_info("Report"), np.arange(3.0), A)
    reads: list[str] = []
    read = disk._read

    def counted(name: str) -> Any:
        reads.append(name)
        return read(name)

    disk._read = counted  # type: ignore[method-assign]
    with pytest.raises(SessionError, match="no value named 'report'"):
        disk.load("report", M)
    assert reads == []
    disk.save(_info("Report"), np.ones(2), A)
    assert disk.load("report", A).tolist() == [1.0, 1.0]  # what the file holds now
