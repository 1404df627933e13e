"""``mpl-broker``: run the broker, or ask a running one for its status."""

from __future__ import annotations

import gc
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import ClusterSpecError, MplError
from mpl.wire.lifetime import die_with_parent
from mpl.wire.logs import configure_logging
from mpl.wire.metrics_cli import metrics_options, start_metrics

__all__ = ["main"]

_LOOPBACK = ("tcp://127.0.0.1:", "tcp://localhost:", "tcp://[::1]:", "inproc://", "ipc://")


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--listen",
    default="tcp://127.0.0.1:5555",
    show_default=True,
    help="ZeroMQ endpoint to bind; port 0 picks a free one (the bound address is printed).",
)
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Cluster spec (YAML, or JSON if it ends in .json): nodes by rank and their devices.",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    help="Instead of --cluster: N nodes with PPUs P0..P{N-1} and an SPU SP0 over all of them.",
)
@click.option(
    "--heartbeat",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    help="Heartbeat interval in seconds; a peer silent for 3 intervals is dead.",
)
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@metrics_options
@click.pass_context
def main(
    ctx: click.Context,
    listen: str,
    cluster_file: Path | None,
    world_size: int | None,
    heartbeat: float,
    verbose: int,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the mpl broker: it connects drivers and the ranked workers of one cluster.

    Workers register by rank, drivers open sessions, and the broker routes jobs, fetches
    and deletes between them; peer data moves worker to worker, not through here.
    SIGTERM or Ctrl-C stops it within 2 seconds.

    \b
    Examples:
      mpl-broker --world-size 2
      mpl-broker --listen tcp://127.0.0.1:0 --cluster cluster.yaml
      mpl-broker status tcp://127.0.0.1:5555
      mpl-broker status tcp://127.0.0.1:5555 --watch 1
      mpl-broker --world-size 2 --metrics-port 9464 --log-format json
    """
    if ctx.invoked_subcommand is not None:
        return
    die_with_parent()
    configure_logging("broker", verbose, log_format)
    if (cluster_file is None) == (world_size is None):
        raise click.UsageError("give exactly one of --cluster FILE or --world-size N")
    try:
        cluster = (
            ClusterSpec.from_file(cluster_file)
            if cluster_file
            else ClusterSpec.simple(world_size or 1)
        )
    except ClusterSpecError as exc:
        raise click.BadParameter(str(exc), param_hint="--cluster") from exc
    if not listen.startswith(_LOOPBACK):
        click.echo(f"warning: {listen} is not loopback and traffic is not encrypted", err=True)

    from mpl.broker.daemon import Broker

    try:
        broker = Broker(cluster, listen, heartbeat_s=heartbeat)
    except Exception as exc:  # a bad endpoint or a port in use
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from exc
    _stop_on_signals(broker.stop)
    server = None
    if metrics_port is not None:
        from mpl.broker.metrics import serve_metrics

        server = start_metrics(lambda: serve_metrics(broker, metrics_host, metrics_port))
    gc.freeze()  # start-up objects never die: keep the collector from walking them
    click.echo(
        f"mpl-broker listening on {broker.address} "
        f"(world size {cluster.world_size}, pid {os.getpid()})"
    )
    if server is not None:
        click.echo(f"mpl-broker metrics on {server.url}metrics, status page on {server.url}")
    sys.stdout.flush()
    broker.serve_forever()


@main.command()
@click.argument("url")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON.")
@click.option(
    "--watch",
    "watch_s",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Redraw the table in place every SECONDS (2 if not given) until Ctrl-C.",
)
def status(url: str, timeout: float, as_json: bool, watch_s: float | None) -> None:
    """Print a running broker's status: ranks, liveness, sessions, jobs, bytes, errors."""
    from mpl.broker.query import query_status

    if watch_s is not None:
        from mpl.broker.watch import watch_status

        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C ends the watch
        watch_status(url, watch_s, timeout=timeout)
        return

    try:
        report = query_status(url, timeout=timeout)
    except MplError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        import json

        click.echo(json.dumps(report, indent=1, default=str))
    else:
        from mpl.wire.status import format_status

        click.echo(format_status(report))


def _stop_on_signals(stop: Any) -> None:
    def handler(signum: int, frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
