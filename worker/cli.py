"""``mpl-worker``: serve one rank of a cluster."""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from mpl.wire import daemon_cli as cli
from mpl.wire.curve import Curve
from mpl.wire.errors import KeyFileError
from mpl.wire.keys import load_keypair
from mpl.wire.lifetime import die_with_parent
from mpl.wire.logs import configure_logging
from mpl.wire.printable import MAX_TEXT_CHARS, one_line

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


def _port_option(flag: str, carries: str) -> Callable[[F], F]:
    """A TCP port other workers connect to; 0 binds any free one."""
    return click.option(
        flag,
        default=0,
        show_default=True,
        type=click.IntRange(0, 65535),
        help=f"TCP port for {carries} (0: any free port). Open it to the other workers.",
    )


_HOUR_MS = 3_600_000.0
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ByteSize(click.ParamType):  # type: ignore[type-arg]
    """A number of bytes: digits, optionally followed by K, M, G or T (powers of 1024; a
    trailing B or iB is allowed: 10G, 10GB and 10GiB are alike)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
        digits, unit = (text[:-1], text[-1]) if text[-1:] in "KMGT" and text else (text, "")
        if not (digits.isascii() and digits.isdigit()):  # isdigit alone takes '²', int not
            self.fail(f"{value!r} is not a size (bytes, or a number with K, M, G or T)", param, ctx)
        return int(digits) * _UNITS[unit]


def _a_number(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """NaN passes a range check (it compares false with both ends): refuse it here."""
    if value is not None and math.isnan(value):
        raise click.BadParameter("must be a number of milliseconds, not nan", ctx, param)
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--broker",
    required=True,
    callback=cli.endpoint(bind=False),
    help="The broker's endpoint, e.g. tcp://127.0.0.1:5555 (what mpl-broker printed).",
)
@click.option(
    "--rank", required=True, type=click.IntRange(min=0), help="The rank this worker serves."
)
@click.option(
    "--data-root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for values saved with persist=True, SPU logs, and the files mpl.io "
    "kernels read and write (secure mode: each driver's under drivers/<name>, the files "
    "placed here read by every driver). Default: .mpl/data/rank<R>.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind for peer data and SPU links; other workers connect to it.",
)
@_port_option("--data-port", "peer data")
@_port_option("--spu-port", "SPU links")
@cli.key_option("This node's secret key file (mpl-keys new NAME): secure mode. Needs --cluster.")
@cli.cluster_option(
    "This party's own copy of the cluster spec: the broker's and the peers' keys are "
    "pinned from it, never taken from the network."
)
@cli.insecure_option("--host")
@cli.max_message_option
@click.option(
    "--job-timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a job may wait for peer data before it fails.",
)
@cli.heartbeat_option("Heartbeat interval in seconds (the broker's Welcome overrides it).")
@click.option(
    "--trusted",
    is_flag=True,
    help="Accept and send pickled values between parties (as `trusted: true` in the cluster "
    "spec): only when one organisation runs every party.",
)
@click.option(
    "--code",
    type=click.Choice(["any", "kernels"]),
    default="any",
    show_default=True,
    help="What this party runs: 'any' function the driver sends, or only 'kernels' "
    "(named kernels installed here, and the built-in ops; anything pickled is refused). "
    "Secure mode: a driver the cluster spec lists with code: kernels is held to kernels "
    "under 'any' too.",
)
@click.option(
    "--kernels",
    "kernel_modules",
    multiple=True,
    metavar="MODULE",
    help="A module whose kernels mp.kernel(...) may call (its MPL_KERNELS mapping, else its "
    "public functions as 'MODULE:name'); repeatable. Installed packages add theirs through "
    "the 'mpl.kernels' entry points.",
)
@click.option(
    "--driver-quota",
    type=ByteSize(),
    default="1G",  # kernel_table.DEFAULT_DRIVER_QUOTA (not imported here: a fast --help)
    show_default=True,
    metavar="SIZE",
    help="Secure mode: the bytes each driver's folder under the data root (drivers/<name>) "
    "may hold, written by the mpl.io write kernels; a write that would pass it fails its job "
    "(DriverQuotaError) and leaves nothing. Bytes, or with K, M, G or T (powers of 1024); "
    "each file and folder counts its size in whole 4 KiB blocks. 0: no quota.",
)
@click.option(
    "--inline-ms",
    type=click.FloatRange(min=0.0, max=_HOUR_MS),
    callback=_a_number,
    default=None,
    hidden=True,
    help="A program whose last run took at most this many ms runs on the I/O thread "
    "(default 1; 0: never). For profilers, whose slowed runs would miss the default.",
)
@cli.verbose_option
@cli.metrics_options
def main(
    broker: str,
    rank: int,
    data_root: Path | None,
    host: str,
    data_port: int,
    spu_port: int,
    key_file: Path | None,
    cluster_file: Path | None,
    insecure: bool,
    max_message: int,
    job_timeout: float,
    heartbeat: float,
    trusted: bool,
    code: str,
    kernel_modules: tuple[str, ...],
    driver_quota: int,
    inline_ms: float | None,
    verbose: int,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the mpl worker for one party (rank) of a cluster.

    It registers with the broker, runs its part of every job, exchanges data directly with
    the other workers, and keeps its party's values. If the broker restarts it re-registers
    by itself. A second worker for a rank that is already served, or a worker whose key is
    not the rank's key in the broker's spec, is refused (exit code 3). SIGTERM or Ctrl-C
    stops it within 2 seconds.

    Secure mode (--key and --cluster): every socket runs CurveZMQ; the worker talks only to
    the broker and peers whose keys its own spec pins, and only the spec's nodes may send it
    data; mp.kernel names resolve through its own spec's op_bindings, never the broker's.
    Without keys it binds loopback only, unless --insecure.

    \b
    Examples:
      mpl-worker --broker tcp://127.0.0.1:5555 --rank 0 --data-root /srv/mpl/alice
      mpl-worker --broker tcp://10.0.0.1:5555 --rank 0 --host 10.0.0.2 \\
          --data-port 6000 --spu-port 6001 --key node0.key_secret --cluster cluster.yaml
    """
    die_with_parent()
    configure_logging("worker", verbose, log_format, rank=rank)
    from mpl.worker.daemon import Worker

    curve = _worker_curve(rank, key_file, cluster_file)
    cli.guard_plaintext(
        curve,
        host,
        insecure=insecure,
        refusal=f"--host {host} is not a loopback address, and without keys peer data is "
        "plaintext and unauthenticated: anyone who reaches it can forge moves. Make keys with "
        "`mpl-keys new NAME`, pin them in the cluster spec and pass --key and --cluster; or, "
        "on a private network you trust, pass --insecure.",
        warning=f"warning: peer data on {host} is plaintext",
    )
    # the worker's own spec (secure mode) may declare the cluster trusted too
    own_spec_trusted = curve is not None and curve.cluster is not None and curve.cluster.trusted
    root = data_root or Path(".mpl") / "data" / f"rank{rank}"
    try:  # the worker makes it anyway: a failure here names the option to fix
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(
            f"{root}: {exc.strerror or exc}", param_hint="--data-root"
        ) from exc
    bind_host = f"[{host}]" if ":" in host else host
    try:
        worker = Worker(
            broker,
            rank,
            data_root=root,
            host=host,
            data_bind=f"tcp://{bind_host}:{data_port}",
            spu_bind=f"tcp://{bind_host}:{spu_port}",
            heartbeat_s=heartbeat,
            job_timeout_s=job_timeout,
            trusted=trusted or own_spec_trusted,
            curve=curve,
            max_message=max_message,
            code=code,
            kernels=kernel_modules,
            driver_quota=driver_quota,
        )
    except Exception as exc:  # a port in use, an unusable data root
        raise cli.start_failed("cannot start", exc) from exc

    if inline_ms is not None:
        worker.jobs.inline_s = inline_ms / 1000
    gc.freeze()  # start-up objects never die: keep the collector from walking them
    cli.stop_on_signals(worker.stop)
    if metrics_port is not None:
        from mpl.worker.metrics import serve_metrics

        server = cli.start_metrics(lambda: serve_metrics(worker, metrics_host, metrics_port))
        click.echo(f"mpl-worker rank {rank} metrics on {server.url}metrics")
    click.echo(
        f"mpl-worker rank {rank} (pid {worker.state.hello.pid}) data {worker.data_addr}, "
        f"spu {worker.spu_links.address}, broker {broker}, "
        f"{'CURVE' if curve else 'plaintext'}"
    )
    sys.stdout.flush()
    worker.serve_forever()
    if worker.refused is not None:
        # the broker's word (it may be hostile): escaped, on one line (wire/printable.py)
        reason = one_line(worker.refused.message, MAX_TEXT_CHARS)
        click.echo(f"mpl-worker: refused: {reason}", err=True)
        sys.exit(3)


def _worker_curve(rank: int, key_file: Path | None, cluster_file: Path | None) -> Curve | None:
    """The worker's CURVE settings, or None in plaintext mode; usage errors exit 2."""
    cluster = None
    if cluster_file is not None:
        cluster = cli.load_cluster(cluster_file)
        if rank >= cluster.world_size:
            raise click.BadParameter(
                f"rank {rank} is not in the cluster (ranks 0..{cluster.world_size - 1})",
                param_hint="--rank",
            )
    if key_file is None:
        if cluster is not None and cluster.secure:
            raise click.UsageError(
                "the cluster spec pins keys: pass --key with this node's secret key file"
            )
        return None
    if cluster is None or not cluster.secure:
        raise click.UsageError("--key needs --cluster: this party's spec that pins the keys")
    try:
        curve = Curve(load_keypair(key_file), cluster)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="--key") from exc
    if curve.keys.public != cluster.nodes[rank].curve_key:
        # the broker decides (it refuses the rank); this only says why ahead of time
        click.echo(
            f"warning: {key_file} is not nodes[{rank}].curve_key in {cluster_file}: "
            "the broker will refuse this worker",
            err=True,
        )
    return curve
