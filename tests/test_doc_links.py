"""Every relative link in README.md and docs/*.md leads somewhere: to a file that exists and,
with a ``#fragment``, to a heading of that file (by GitHub's rule for heading anchors). Pages
moved or sections renamed break a link silently otherwise; the reader finds out first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks (a link or heading there is code)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation other than
    ``-`` and ``_`` removed, each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of ``path`` (a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _prose_lines(path):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The targets of the markdown links of ``path``'s prose (code spans left out)."""
    targets: list[str] = []
    for line in _prose_lines(path):
        prose = _CODE_SPAN.sub("code", line)
        targets += _LINK.findall(prose)
    return targets


def _relative(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is None  # http:, https:, mailto: are not


def test_the_pages_are_found() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "trust.md", "operations.md", "protocol.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    for target in links(page):
        if not _relative(target):
            continue
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
        elif fragment and (dest.suffix != ".md" or fragment not in anchors(dest)):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert broken == [], f"broken links in {page.relative_to(ROOT)}"


def test_the_checker_reads_links_and_anchors(tmp_path: Path) -> None:
    """What the check above reads: a page with a good anchor, a bad one, a missing file, and
    links inside code that are no links."""
    page = tmp_path / "page.md"
    page.write_text(
        "# A title: with `code`, punctuation\n\n[ok](#a-title-with-code-punctuation) "
        "[bad](#nowhere) [file](missing.md) `[not a link](x.md)`\n\n```\n[code](y.md)\n```\n"
    )
    assert anchors(page) == {"a-title-with-code-punctuation"}
    assert links(page) == ["#a-title-with-code-punctuation", "#nowhere", "missing.md"]
    assert slug("The daemons' flags") == "the-daemons-flags"
    assert slug("Where we differ from / add to ARCHITECTURE.md") == (
        "where-we-differ-from--add-to-architecturemd"
    )
