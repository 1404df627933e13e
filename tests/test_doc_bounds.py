"""docs/trust.md's table of bounds names each bound's constant and its module: every name
given there is defined in that module, so a renamed or removed constant shows up here
rather than as a stale line of the docs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODULE = "wire/limits.py"


def _rows() -> list[str]:
    """The third cell of each row of the table under "## Every bound"."""
    text = (ROOT / "docs" / "trust.md").read_text()
    start = text.index("## Every bound")
    end = text.index("\n## ", start + 1)
    cells = []
    for line in text[start:end].splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(parts) == 3 and not set(parts[0]) <= {"-"}:
            cells.append(parts[2])
    return cells[1:]  # the header row names no constant


def named(cell: str) -> list[tuple[str, str]]:
    """(constant, module) pairs of one cell: each name's module is the next ``(`path`)``
    after it, else wire/limits.py; a flag (``--heartbeat``) is no constant."""
    pairs: list[tuple[str, str]] = []
    pending: list[str] = []
    for token in re.findall(r"\(`([\w/]+\.py)`\)|`([A-Za-z_]\w*)`", cell):
        module, name = token
        if module:
            pairs += [(n, module) for n in pending]
            pending = []
        else:
            pending.append(name)
    return pairs + [(n, DEFAULT_MODULE) for n in pending]


def _defines(source: str, name: str) -> bool:
    pattern = rf"^(?:def {name}\(|[\w, ]*\b{name}\b[\w, ]*(?::[^=\n]*)?=)"
    return re.search(pattern, source, re.MULTILINE) is not None


def test_every_constant_in_the_bounds_table_is_defined_where_it_says() -> None:
    rows = _rows()
    assert len(rows) > 40  # the table was found and read
    missing = []
    for cell in rows:
        pairs = named(cell)
        assert pairs, f"a row names no constant: {cell}"
        for name, module in pairs:
            if not _defines((ROOT / module).read_text(), name):
                missing.append(f"{name} in {module}")
    assert missing == []


def test_a_cell_gives_each_name_its_module() -> None:
    cell = "`A` (`worker/a.py`), `B`, `C` (`wire/c.py`), `D`"
    assert named(cell) == [
        ("A", "worker/a.py"),
        ("B", "wire/c.py"),
        ("C", "wire/c.py"),
        ("D", DEFAULT_MODULE),
    ]
