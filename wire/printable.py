"""Text from the network made safe to print on a terminal.

Error messages, tracebacks, host names, op names and progress reports reach a driver (and
the ``mpl-broker status`` operator) from parties and a broker that may be hostile. Printed
as received, an ESC or CSI sequence in them drives the reader's terminal: it can rewrite or
hide earlier lines (a forged "job done"), set the window title, or, on terminals that honour
OSC 52, write the clipboard. Bidirectional overrides reorder what the reader sees. So every
such character is shown as its Python escape (``\\x1b``, ``\\u202e``), and the text is cut
to a length a reader can take in.

:func:`printable` keeps newlines and tabs (tracebacks are many lines); :func:`one_line`
escapes them too, for table cells and progress bars.
"""

from __future__ import annotations

__all__ = ["MAX_LINE_CHARS", "MAX_TEXT_CHARS", "one_line", "printable"]

MAX_TEXT_CHARS = 64 * 1024  # an error message or a traceback
MAX_LINE_CHARS = 256  # a table cell, an op name on a progress bar

# C0 controls, DEL, C1 controls (0x9b is a one-byte CSI on some terminals), the
# bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and marks
# (U+061C, U+200E, U+200F), and the line and paragraph separators (U+2028, U+2029: a new
# line to str.splitlines, so to any Python tool reading a log)
_CONTROLS = [*range(0x00, 0x20), *range(0x7F, 0xA0)]
_BIDI_AND_SEPARATORS = [
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    *(0x061C, 0x200E, 0x200F, 0x2028, 0x2029),
]
_ESCAPES: dict[int, str] = {
    **{c: f"\\x{c:02x}" for c in _CONTROLS},
    **{c: f"\\u{c:04x}" for c in _BIDI_AND_SEPARATORS},
}
_MULTI_LINE = {c: e for c, e in _ESCAPES.items() if chr(c) not in "\n\t"}


def _shown(s: str, limit: int, table: dict[int, str]) -> str:
    # the cut is made on the text as received, then what is kept is escaped: an escape
    # lengthens the text (at most 6 characters for one), never past 6 * limit
    kept = s if len(s) <= limit else s[:limit]
    if not kept.isprintable():  # the common case skips the translation: one C scan
        kept = kept.translate(table)
    if len(s) > limit:
        kept += f"... ({len(s) - limit} more characters)"
    return kept


def printable(text: object, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` (made a str) with control and bidi characters escaped, newlines and tabs
    kept, cut to its first ``limit`` characters (the cut is said)."""
    return _shown(text if type(text) is str else str(text), limit, _MULTI_LINE)


def one_line(text: object, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` on one line: as :func:`printable`, with newlines and tabs escaped too."""
    return _shown(text if type(text) is str else str(text), limit, _ESCAPES)
