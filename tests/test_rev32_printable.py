"""Review of w32's trust changes: what ``wire/printable.py`` escapes.

Besides C0/C1 controls and the bidi embeddings, overrides and isolates, a peer's text may
carry U+2028 and U+2029 (line and paragraph separators: Python's ``str.splitlines``, and
so any tool of it reading a log, starts a new line at each, so one forges a log line as a
newline did) and the bidi marks U+200E, U+200F and U+061C (they reorder neutral
characters around them, as an override does, more weakly). Each is shown escaped now.
"""

from __future__ import annotations

import pytest

from mpl.wire.printable import one_line, printable


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\u200e", "\u200f", "\u061c"])
def test_separators_and_bidi_marks_are_escaped(char: str) -> None:
    forged = f"refused{char}2026-12-02 10:00:00 mpl-broker ERROR rank 1 lost"
    for shown in (one_line(forged), printable(forged)):
        assert char not in shown and f"\\u{ord(char):04x}" in shown
        assert len(shown.splitlines()) == 1


def test_ordinary_text_is_unchanged() -> None:
    text = "op 3 (save 'model'): Größe 3 \u00e9t\u00e9 \u4e2d\u6587"
    assert one_line(text) == printable(text) == text
    assert printable("line one\n\tline two") == "line one\n\tline two"
