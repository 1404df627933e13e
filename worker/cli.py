"""``mpl-worker``: serve one rank of a cluster."""

from __future__ import annotations

import gc
import signal
import sys
from pathlib import Path
from typing import Any

import click

from mpl.wire.lifetime import die_with_parent
from mpl.wire.logs import configure_logging
from mpl.wire.metrics_cli import metrics_options, start_metrics

__all__ = ["main"]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--broker", required=True, help="The broker's endpoint, e.g. tcp://127.0.0.1:5555.")
@click.option(
    "--rank", required=True, type=click.IntRange(min=0), help="The rank this worker serves."
)
@click.option(
    "--data-root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for values saved with persist=True (and SPU logs). Default: .mpl/data/rank<R>.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to bind for peer data; other workers connect to it.",
)
@click.option(
    "--job-timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a job may wait for peer data before it fails.",
)
@click.option(
    "--heartbeat",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    help="Heartbeat interval in seconds (the broker's Welcome overrides it).",
)
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@metrics_options
def main(
    broker: str,
    rank: int,
    data_root: Path | None,
    host: str,
    job_timeout: float,
    heartbeat: float,
    verbose: int,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the mpl worker for one party (rank) of a cluster.

    It registers with the broker, runs its part of every job, exchanges data directly with
    the other workers, and keeps its party's values. If the broker restarts it re-registers
    by itself. A second worker for a rank that is already served is refused (exit code 3).
    SIGTERM or Ctrl-C stops it within 2 seconds.

    \b
    Example:
      mpl-worker --broker tcp://127.0.0.1:5555 --rank 0 --data-root /srv/mpl/alice
    """
    die_with_parent()
    configure_logging("worker", verbose, log_format, rank=rank)
    from mpl.worker.daemon import Worker

    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: peer data on {host} is not encrypted", err=True)
    root = data_root or Path(".mpl") / "data" / f"rank{rank}"
    try:
        worker = Worker(
            broker,
            rank,
            data_root=root,
            host=host,
            heartbeat_s=heartbeat,
            job_timeout_s=job_timeout,
        )
    except Exception as exc:  # a bad endpoint, an unusable data root
        raise click.ClickException(f"cannot start: {exc}") from exc

    def stop(signum: int, frame: Any) -> None:
        worker.stop()

    gc.freeze()  # start-up objects never die: keep the collector from walking them
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if metrics_port is not None:
        from mpl.worker.metrics import serve_metrics

        server = start_metrics(lambda: serve_metrics(worker, metrics_host, metrics_port))
        click.echo(f"mpl-worker rank {rank} metrics on {server.url}metrics")
    click.echo(
        f"mpl-worker rank {rank} (pid {worker.core.hello.pid}) data {worker.data_addr}, "
        f"broker {broker}"
    )
    sys.stdout.flush()
    worker.serve_forever()
    if worker.refused is not None:
        click.echo(f"mpl-worker: refused: {worker.refused.message}", err=True)
        sys.exit(3)
