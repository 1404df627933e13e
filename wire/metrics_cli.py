"""Command-line options both daemons share: ``--log-format``, ``--metrics-port`` and
``--metrics-host``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from mpl.wire.logs import LOG_FORMATS

__all__ = ["metrics_options", "start_metrics"]

F = TypeVar("F", bound=Callable[..., Any])


def metrics_options(fn: F) -> F:
    """Add the logging and metrics options to a daemon's click command."""
    fn = click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        help="Interface for the metrics port. Loopback by default: the page shows the "
        "cluster's ranks, sessions and errors, so expose it deliberately (0.0.0.0 for all).",
    )(fn)
    fn = click.option(
        "--metrics-port",
        type=click.IntRange(min=0, max=65535),
        default=None,
        help="Serve Prometheus metrics on http://HOST:PORT/metrics (and the broker's status "
        "page on /); 0 picks a free port and prints it. Off unless given.",
    )(fn)
    fn = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="text",
        show_default=True,
        help="text: readable lines; json: one JSON object per line (time, level, role, "
        "rank, session, job, message, error) for a log system.",
    )(fn)
    return fn


def start_metrics(start: Callable[[], Any]) -> Any:
    """Run ``start`` (which binds the metrics port), turning a bind failure into a usage
    error that names the port."""
    try:
        return start()
    except OSError as exc:
        raise click.ClickException(f"cannot serve metrics: {exc}") from exc
