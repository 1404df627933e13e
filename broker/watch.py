"""``mpl-broker status URL --watch``: redraw the status table in place until Ctrl-C."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from mpl.broker.query import StatusProbe
from mpl.wire.curve import Curve
from mpl.wire.errors import MplTimeoutError
from mpl.wire.status import format_status

__all__ = ["CLEAR", "watch_status"]

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: each frame replaces the last


def watch_status(
    url: str,
    every_s: float,
    *,
    timeout: float = 5.0,
    out: TextIO | None = None,
    frames: int | None = None,
    render: Callable[[dict[str, Any]], str] = format_status,
    curve: Curve | None = None,
) -> int:
    """Redraw ``url``'s status every ``every_s`` seconds; returns the frames drawn.

    It runs until Ctrl-C (or ``frames`` frames, for tests). A broker that does not answer
    in time shows as such on the screen, and the watch goes on: it may come back.
    """
    stream = out or sys.stdout
    drawn = 0
    with StatusProbe(url, curve=curve) as probe:
        try:
            while frames is None or drawn < frames:
                began = time.monotonic()
                try:
                    body = render(probe.ask(timeout))
                except MplTimeoutError as exc:
                    body = f"{exc}; still trying"
                stamp = time.strftime("%H:%M:%S")
                stream.write(f"{CLEAR}{url} at {stamp}, every {every_s:g} s (Ctrl-C quits)\n\n")
                stream.write(body + "\n")
                stream.flush()
                drawn += 1
                time.sleep(max(0.0, every_s - (time.monotonic() - began)))
        except KeyboardInterrupt:
            stream.write("\n")
            stream.flush()
    return drawn
