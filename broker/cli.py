"""``mpl-broker``: run the broker, or ask a running one for its status."""

from __future__ import annotations

import gc
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from mpl.wire import daemon_cli as cli
from mpl.wire.cluster import ClusterSpec
from mpl.wire.curve import Curve
from mpl.wire.errors import ClusterSpecError, KeyFileError, MplError, MplTimeoutError
from mpl.wire.keys import is_z85_key, load_keypair
from mpl.wire.lifetime import die_with_parent
from mpl.wire.logs import configure_logging

__all__ = ["main"]

_NO_KEYS = (
    "{where} is not a loopback address, and without keys all traffic is plaintext and "
    "unauthenticated: anyone who reaches it can act as any party. Make keys with "
    "`mpl-keys new NAME`, pin them in the cluster spec and pass --key; or, on a private "
    "network you trust, pass --insecure."
)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--listen",
    default="tcp://127.0.0.1:5555",
    show_default=True,
    callback=cli.endpoint(bind=True),
    help="ZeroMQ endpoint to bind; port 0 picks a free one (the bound address is printed).",
)
@cli.cluster_option(
    "Cluster spec (YAML, or JSON if it ends in .json): nodes by rank and their devices."
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    help="Instead of --cluster: N nodes with PPUs P0..P{N-1} and an SPU SP0 over all of them.",
)
@cli.heartbeat_option("Heartbeat interval in seconds; a peer silent for 3 intervals is dead.")
@cli.key_option(
    "The broker's secret key file (mpl-keys new broker): secure mode. Needs a --cluster "
    "that pins keys; its broker.curve_key must be this key's public half."
)
@cli.insecure_option("--listen")
@cli.max_message_option
@cli.verbose_option
@cli.metrics_options
@click.pass_context
def main(
    ctx: click.Context,
    listen: str,
    cluster_file: Path | None,
    world_size: int | None,
    heartbeat: float,
    key_file: Path | None,
    insecure: bool,
    max_message: int,
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
      mpl-broker --listen tcp://10.0.0.1:5555 --cluster cluster.yaml --key broker.key_secret
      mpl-broker status tcp://127.0.0.1:5555
      mpl-broker status tcp://127.0.0.1:5555 --watch 1
      mpl-broker --world-size 2 --metrics-port 9464 --log-format json

    Secure mode (--key): every connection runs CurveZMQ, and only the workers and drivers
    whose keys the cluster spec pins get in. Without keys the broker listens on loopback
    only, unless --insecure.
    """
    if ctx.invoked_subcommand is not None:
        return
    die_with_parent()
    configure_logging("broker", verbose, log_format)
    if (cluster_file is None) == (world_size is None):
        raise click.UsageError("give exactly one of --cluster FILE or --world-size N")
    cluster = (
        cli.load_cluster(cluster_file) if cluster_file else ClusterSpec.simple(world_size or 1)
    )
    curve = _broker_curve(cluster, key_file)
    cli.guard_plaintext(
        curve,
        listen,
        insecure=insecure,
        refusal=_NO_KEYS.format(where=f"--listen {listen}"),
        warning=f"warning: {listen} is not loopback and traffic is plaintext",
    )

    from mpl.broker.daemon import Broker

    try:
        broker = Broker(
            cluster, listen, heartbeat_s=heartbeat, curve=curve, max_message=max_message
        )
    except Exception as exc:  # a port in use, an address not of this host
        raise cli.start_failed(f"cannot listen on {listen}", exc) from exc
    cli.stop_on_signals(broker.stop)
    server = None
    if metrics_port is not None:
        from mpl.broker.metrics import serve_metrics

        server = cli.start_metrics(lambda: serve_metrics(broker, metrics_host, metrics_port))
    gc.freeze()  # start-up objects never die: keep the collector from walking them
    click.echo(
        f"mpl-broker listening on {broker.address} "
        f"(world size {cluster.world_size}, {'CURVE' if curve else 'plaintext'}, "
        f"pid {os.getpid()})"
    )
    if server is not None:
        click.echo(f"mpl-broker metrics on {server.url}metrics, status page on {server.url}")
    sys.stdout.flush()
    broker.serve_forever()


def _broker_curve(cluster: ClusterSpec, key_file: Path | None) -> Curve | None:
    """The broker's CURVE settings, or None in plaintext mode; usage errors exit 2."""
    if key_file is None:
        if cluster.secure:
            raise click.UsageError(
                "the cluster spec pins keys: pass --key with the broker's secret key file"
            )
        return None
    if not cluster.secure:
        raise click.UsageError(
            "--key needs a --cluster spec that pins keys (broker, nodes and drivers)"
        )
    try:
        keys = load_keypair(key_file)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="--key") from exc
    if keys.public != cluster.broker_key:
        raise click.BadParameter(
            f"{key_file} is not the key the spec pins as broker.curve_key", param_hint="--key"
        )
    return Curve(keys, cluster)


@main.command()
@click.argument("url", callback=cli.endpoint(bind=False))
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON.")
@cli.key_option("A driver's secret key file, to ask a secure broker.")
@cli.cluster_option("With --key: the spec that pins the broker's key.")
@click.option("--broker-key", help="With --key, instead of --cluster: the broker's public key.")
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
@click.option(
    "--sessions",
    "show_sessions",
    is_flag=True,
    help="List the sessions only (secure mode: yours in full, the others counted).",
)
@click.option(
    "--symbols",
    "show_symbols",
    is_flag=True,
    help="List the persisted names only, one row per party holding one (secure mode: yours).",
)
def status(
    url: str,
    timeout: float,
    as_json: bool,
    key_file: Path | None,
    cluster_file: Path | None,
    broker_key: str | None,
    watch_s: float | None,
    show_sessions: bool,
    show_symbols: bool,
) -> None:
    """Print a running broker's status: ranks, liveness, sessions, jobs, bytes, errors."""
    from mpl.broker.query import query_status

    curve = None
    if key_file is not None:
        try:
            spec = ClusterSpec.from_file(cluster_file) if cluster_file else None
            if broker_key is not None and not is_z85_key(broker_key):
                raise click.BadParameter("not a 40-character z85 key", param_hint="--broker-key")
            curve = Curve(load_keypair(key_file), spec, broker_key or "")
            curve.broker  # noqa: B018 - fails early without a broker key
        except (KeyFileError, ClusterSpecError, ValueError) as exc:
            raise click.UsageError(str(exc)) from exc
    if watch_s is not None:
        from mpl.broker.watch import watch_status

        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C ends the watch
        watch_status(url, watch_s, timeout=timeout, curve=curve)
        return

    try:
        report = query_status(url, timeout=timeout, curve=curve)
        if show_symbols:
            report = query_status(url, timeout=timeout, curve=curve, what="symbols")
    except MplError as exc:
        hint = "" if curve else " (a secure broker answers only listed drivers: pass --key)"
        if isinstance(exc, MplTimeoutError):
            hint = f": is mpl-broker running at that address?{hint}"
        raise click.ClickException(f"{exc}{hint}") from exc
    if show_sessions or show_symbols:
        _print_listing(report, show_sessions, as_json)
        return
    if as_json:
        import json

        click.echo(json.dumps(report, indent=1, default=str))
    else:
        from mpl.wire.status import format_status

        click.echo(format_status(report))


def _print_listing(report: dict[str, Any], sessions: bool, as_json: bool) -> None:
    from mpl.broker.listing import format_rows
    from mpl.wire.printable import one_line

    if sessions:
        rows = report.get("sessions", [])
        if as_json:
            import json

            click.echo(json.dumps({"sessions": rows, "others": report.get("other_sessions", 0)}))
            return
        columns: tuple[str, ...] = (
            "session",
            "name",
            "owner",
            "drivers",
            "idle_s",
            "lease_s",
            "symbols",
            "jobs",
        )
        click.echo(format_rows(rows, columns, "no session to show"))
        if report.get("other_sessions"):
            # the broker's word, as every cell of the table: escaped (wire/printable.py)
            others = one_line(report["other_sessions"])
            click.echo(f"(and {others} session(s) of other drivers)")
        return
    rows = report.get("persisted", [])
    if as_json:
        import json

        click.echo(json.dumps({"persisted": rows}))
        return
    columns = ("name", "rank", "device", "parties", "meta", "size_bytes")
    click.echo(format_rows(rows, columns, "no persisted name"))
