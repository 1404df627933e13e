"""Third red team w32, R32-2 for the daemons' logs: a peer's text forged log lines.

Daemons log what peers sent: a worker logs its broker's refusal message, the broker a
worker's host and reasons, both the text of refused messages. In the default text format
the message went out as it came, so a newline in it wrote a line of the peer's choosing
("... ERROR rank 1 lost") into another party's log, and ESC sequences drove the terminal
of whoever tailed it. The text format now escapes control characters in the message (the
JSON format always did, being JSON).
"""

from __future__ import annotations

import logging

from mpl.wire.logs import configure_logging

_FORGED = "no\n2026-12-02 10:00:00 mpl-broker ERROR rank 1 lost\x1b]0;pwned\x07"


def test_a_peers_text_cannot_forge_a_log_line_or_drive_the_terminal() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("worker", 0, "text", rank=0)
        (handler,) = root.handlers
        assert handler.formatter is not None
        record = logging.LogRecord(
            "mpl.worker", logging.ERROR, __file__, 1, "rank %d: refused by the broker: %s",
            (0, _FORGED), None,
        )  # fmt: skip
        line = handler.formatter.format(record)
        assert "\n" not in line and "\x1b" not in line and "\x07" not in line
        assert "refused by the broker: no\\x0a2026-12-02" in line  # shown, escaped
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
