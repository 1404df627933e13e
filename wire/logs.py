"""Daemon logging: human-readable lines by default, one JSON object per line on request,
and a limiter so that a misbehaving peer cannot flood the log with its refusals.

A JSON line carries ``time`` (ISO 8601, UTC), ``level``, ``role`` (broker / worker),
``rank`` (a worker's own rank), ``session``, ``job``, ``peer``, ``message`` and ``error``
(the exception, when one is attached). Callers add the ids with ``extra=``::

    log.warning("job failed", extra={"session": sid, "job": job})
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from mpl.wire.lru import LRU
from mpl.wire.printable import one_line, printable

__all__ = ["LOG_FORMATS", "JsonFormatter", "RefusalLog", "TextFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
_CONTEXT_KEYS = ("session", "job", "peer")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (no newline inside, whatever the message)."""

    def __init__(self, role: str, rank: int | None = None) -> None:
        super().__init__()
        self.role = role
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "role": self.role,
            "rank": getattr(record, "rank", self.rank),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in _CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line["error"] = f"{type(exc).__name__}: {exc}"
            line["traceback"] = self.formatException(record.exc_info)
        elif (error := getattr(record, "error", None)) is not None:
            line["error"] = str(error)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """The human-readable line. A message often quotes what a peer sent (a broker's refusal,
    a worker's host, a reason): shown on one line with control characters escaped and cut
    (``wire/printable.py``), so a peer can neither forge log lines with a newline nor drive
    the terminal of whoever reads the log. An attached traceback keeps its lines, its
    control characters escaped too, each line indented: its last lines are the exception's
    text, which may quote a peer (``Guard.internal`` logs one), and a line a newline there
    starts is never one that begins at the margin, as a log line does."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message, _LOG_LINE_CHARS)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        shown = printable(super().formatException(ei))
        return "\n".join(f"  {line}" for line in shown.split("\n"))


_LOG_LINE_CHARS = 4096


def configure_logging(role: str, verbose: int, log_format: str, rank: int | None = None) -> None:
    """Set up the root logger of a daemon process (``verbose``: 0 warnings, 1 info, 2 debug)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter(role, rank))
    else:
        who = f"mpl-{role}" if rank is None else f"mpl-{role}[{rank}]"
        handler.setFormatter(TextFormatter(f"%(asctime)s {who} %(levelname)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel([logging.WARNING, logging.INFO, logging.DEBUG][min(max(verbose, 0), 2)])


class RefusalLog:
    """Logs each refused peer once per ``quiet_s``, and at most ``burst`` refusals a second.

    Refusals come from the network, so the log must not grow with what a peer sends: the
    first refusal of a peer is logged with its reason, repeats within ``quiet_s`` are only
    counted, and the next line says how many were suppressed. The peer table is bounded.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        quiet_s: float = 60.0,
        burst: int = 10,
        peers: int = 4096,
        clock: Any = time.monotonic,
    ) -> None:
        self.logger = logger
        self.quiet_s = quiet_s
        self.burst = burst
        self.clock = clock
        self._seen: LRU[str, list[float]] = LRU(peers)  # peer -> [last logged, suppressed]
        self._second = 0.0
        self._in_second = 0
        self.suppressed = 0

    def refused(self, peer: str, reason: str, **extra: Any) -> bool:
        """Note that ``peer`` was refused for ``reason``; True if a line was written."""
        now = self.clock()
        entry = self._seen.get(peer)
        if entry is not None and now - entry[0] < self.quiet_s:
            entry[1] += 1
            self.suppressed += 1
            return False
        if now - self._second >= 1.0:
            self._second, self._in_second = now, 0
        if self._in_second >= self.burst:
            self.suppressed += 1
            return False
        self._in_second += 1
        repeats = int(entry[1]) if entry is not None else 0
        self._seen[peer] = [now, 0]
        more = f" ({repeats} more refusals from it were not logged)" if repeats else ""
        self.logger.warning(
            "refused %s: %s%s", peer, reason, more, extra={"peer": peer, "error": reason, **extra}
        )
        return True
