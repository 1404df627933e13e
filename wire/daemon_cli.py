"""Command-line pieces both daemons (``mpl-broker``, ``mpl-worker``) share: the options they
have in common, each defined once (help texts that differ per daemon are passed in), the
plaintext guard, the metrics start-up and the stop signals."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from mpl.wire.cluster import ClusterSpec
from mpl.wire.curve import Curve, plaintext_safe
from mpl.wire.endpoints import check_endpoint
from mpl.wire.errors import ClusterSpecError
from mpl.wire.limits import MAX_HEARTBEAT_S
from mpl.wire.logs import LOG_FORMATS
from mpl.wire.sockets import MAX_MESSAGE, MIN_MAX_MESSAGE

__all__ = [
    "cluster_option",
    "endpoint",
    "guard_plaintext",
    "heartbeat_option",
    "insecure_option",
    "key_option",
    "load_cluster",
    "max_message_option",
    "metrics_options",
    "start_failed",
    "start_metrics",
    "stop_on_signals",
    "verbose_option",
]

F = TypeVar("F", bound=Callable[..., Any])


def cluster_option(help_text: str) -> Callable[[F], F]:
    """``--cluster FILE`` (passed as ``cluster_file``): a spec that must exist."""
    return click.option(
        "--cluster",
        "cluster_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=help_text,
    )


def key_option(help_text: str) -> Callable[[F], F]:
    """``--key FILE`` (passed as ``key_file``): a secret key file."""
    return click.option(
        "--key", "key_file", type=click.Path(dir_okay=False, path_type=Path), help=help_text
    )


def insecure_option(bind_flag: str) -> Callable[[F], F]:
    """``--insecure``: allow ``bind_flag`` off loopback without keys."""
    return click.option(
        "--insecure",
        is_flag=True,
        help=f"Allow {bind_flag} on a non-loopback address without keys (plaintext; private "
        "networks).",
    )


def heartbeat_option(help_text: str) -> Callable[[F], F]:
    """``--heartbeat SECONDS``, 1 by default, at most what a worker takes from its broker's
    Welcome (``MAX_HEARTBEAT_S``)."""
    return click.option(
        "--heartbeat",
        default=1.0,
        show_default=True,
        type=click.FloatRange(min=0.05, max=MAX_HEARTBEAT_S),
        help=help_text,
    )


def max_message_option(fn: F) -> F:
    """``--max-message BYTES``: MAXMSGSIZE on the sockets that carry values."""
    return click.option(
        "--max-message",
        default=MAX_MESSAGE,
        show_default=True,
        type=click.IntRange(min=MIN_MAX_MESSAGE),
        help="Largest frame (bytes) a peer may send; a bigger one drops its connection.",
    )(fn)


def verbose_option(fn: F) -> F:
    """``-v``/``--verbose``, counted."""
    return click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")(
        fn
    )


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


def load_cluster(cluster_file: Path) -> ClusterSpec:
    """Read the spec given as ``--cluster``; a bad one is a usage error (exit 2)."""
    try:
        return ClusterSpec.from_file(cluster_file)
    except ClusterSpecError as exc:
        raise click.BadParameter(str(exc), param_hint="--cluster") from exc


def guard_plaintext(
    curve: Curve | None, address: str, *, insecure: bool, refusal: str, warning: str
) -> None:
    """Without keys, a daemon binds loopback only: elsewhere it exits with ``refusal`` (a
    usage error), or with ``--insecure`` goes on after printing ``warning``."""
    if curve is not None or plaintext_safe(address):
        return
    if not insecure:
        raise click.UsageError(refusal)
    click.echo(warning, err=True)


def start_metrics(start: Callable[[], Any]) -> Any:
    """Run ``start`` (which binds the metrics port), turning a bind failure into a usage
    error that names the port."""
    try:
        return start()
    except OSError as exc:
        raise click.ClickException(f"cannot serve metrics: {exc}") from exc


def stop_on_signals(stop: Callable[[], object]) -> None:
    """SIGTERM and SIGINT (Ctrl-C) call ``stop``; the daemon then ends within 2 seconds."""

    def handler(signum: int, frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def endpoint(*, bind: bool) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback refusing (exit 2) an option or argument that is not an endpoint
    (``mpl.wire.endpoints.check_endpoint``): a bind address when ``bind``."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return value
        try:
            return check_endpoint(value, bind=bind)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from exc

    return check


def start_failed(what: str, exc: Exception) -> click.ClickException:
    """The error a daemon exits with when it cannot start (``what`` failed, ``exc`` says
    why); a port in use, the usual cause, says what to do about it."""
    hint = ""
    if "in use" in str(exc):
        hint = (
            ": another process holds that port (an mpl daemon still running?); stop it, or "
            "choose another port (0 picks a free one)"
        )
    return click.ClickException(f"{what}: {exc}{hint}")
