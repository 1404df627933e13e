"""README's module list ("Layout": modules, by what they do) names every module of the four
packages, and only modules that exist: a reader looking for where something lives finds it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("wire", "broker", "worker", "driver")


def _listed() -> dict[str, set[str]]:
    """Per package, the names the README's module list gives in backquotes."""
    text = (ROOT / "README.md").read_text()
    start = text.index("Modules, by what they do")
    end = text.index("Dependencies point one way", start)
    listed: dict[str, set[str]] = {}
    part = ""
    for line in text[start:end].splitlines():
        head = re.match(r"- \*\*`mpl\.(\w+)`\*\*", line)
        if head:
            part = head.group(1)
            listed[part] = set()
        elif part:
            # a name in backquotes; a parenthesised command name (`mpl-keys`) is no module
            listed[part] |= set(re.findall(r"`([a-z_0-9]+)`", re.sub(r"\(`[^`]*`\)", "", line)))
    return listed


def test_the_readme_lists_every_module_and_no_other() -> None:
    listed = _listed()
    assert set(listed) == set(PARTS)
    for part in PARTS:
        present = {p.stem for p in (ROOT / part).glob("*.py") if p.stem != "__init__"}
        assert present - listed[part] == set(), f"mpl.{part} modules the README does not list"
        assert listed[part] - present == set(), f"the README lists mpl.{part} modules that are gone"
