"""``mpl-keys``: make and inspect the CURVE key pairs that identify brokers, nodes and drivers."""

from __future__ import annotations

from pathlib import Path

import click

from mpl.wire.errors import KeyFileError
from mpl.wire.keys import load_public_key, write_keypair

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Make and inspect mpl's CURVE keys (ZeroMQ certificate files).

    Every process of a secure cluster has a key pair: the broker, each node's worker and
    each driver. `mpl-keys new NAME` writes NAME.key (public: give its key to the other
    parties, who pin it in their copy of the cluster spec) and NAME.key_secret (keep it:
    pass it with --key / key=). The spec pins public keys:

    \b
      broker:  {curve_key: "<broker's key>"}
      nodes:   [{name: node0, curve_key: "<node0's key>"}, ...]
      drivers: [{name: analyst, curve_key: "<analyst's key>"}]

    \b
    Examples:
      mpl-keys new node0 --dir keys/
      mpl-keys show keys/node0.key
    """


@main.command()
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write NAME.key and NAME.key_secret into (created if missing).",
)
@click.option("--force", is_flag=True, help="Replace existing files of that name.")
def new(name: str, directory: Path, force: bool) -> None:
    """Make a key pair NAME.key / NAME.key_secret (mode 0600) and print the public key."""
    try:
        public_file, secret_file, public = write_keypair(directory, name, overwrite=force)
    except (KeyFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(public)
    click.echo(f"wrote {public_file} (public) and {secret_file} (secret, keep it)", err=True)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def show(file: Path) -> None:
    """Print the public key (z85) of a key file, public or secret; the secret stays hidden."""
    try:
        click.echo(load_public_key(file))
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":
    main()
