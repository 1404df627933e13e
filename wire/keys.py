"""CURVE key files: make them, read them, check the keys in them.

A key pair lives in two files in ZeroMQ's certificate format (what ``zmq.auth`` writes and
``zmq.auth.load_certificate`` reads): ``NAME.key`` holds the public key, to hand to the
other parties for their cluster spec; ``NAME.key_secret`` holds both keys and never leaves
its owner (it is created with mode 0600). Keys are 40-character z85 strings.

Every part that needs its own key goes through :func:`load_keypair`, so a missing file, a
public-only file where the secret is needed, or a mangled key gives the same clear error.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from mpl.wire.errors import KeyFileError

__all__ = [
    "KEY_LENGTH",
    "KeyPair",
    "is_z85_key",
    "load_keypair",
    "load_public_key",
    "write_keypair",
]

log = logging.getLogger("mpl.keys")

KEY_LENGTH = 40  # z85 of 32 bytes
_Z85 = frozenset(
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


@dataclass(frozen=True)
class KeyPair:
    """A process's own CURVE keys (z85 text). ``repr`` hides the secret."""

    public: str
    secret: str

    def __repr__(self) -> str:
        return f"KeyPair(public={self.public!r}, secret=<hidden>)"


def is_z85_key(value: object) -> bool:
    """True if ``value`` is a 40-character z85 string (the text form of a 32-byte key)."""
    return isinstance(value, str) and len(value) == KEY_LENGTH and set(value) <= _Z85


def _read(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    path = Path(path)
    if not path.is_file():
        raise KeyFileError(f"{path}: no such key file; make one with `mpl-keys new NAME`")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: not a ZeroMQ key file ({exc})") from exc
    pub = public.decode("ascii", "replace")
    sec = secret.decode("ascii", "replace") if secret is not None else None
    if not is_z85_key(pub):
        raise KeyFileError(f"{path}: the public key is not a 40-character z85 string")
    if sec is not None and not is_z85_key(sec):
        raise KeyFileError(f"{path}: the secret key is not a 40-character z85 string")
    return pub, sec


def load_public_key(path: str | os.PathLike[str]) -> str:
    """The public key (z85) in a ``.key`` or ``.key_secret`` file."""
    return _read(path)[0]


def load_keypair(path: str | os.PathLike[str]) -> KeyPair:
    """This process's key pair from its ``NAME.key_secret`` file.

    Raises :class:`KeyFileError` when the file is missing, holds only a public key, or
    holds something that is not a key. The public key is checked against the secret one,
    so a hand-edited file cannot claim another party's identity by accident.
    """
    public, secret = _read(path)
    if secret is None:
        raise KeyFileError(
            f"{path}: holds only a public key; pass the secret file (NAME.key_secret)"
        )
    try:
        derived = zmq.curve_public(secret.encode("ascii")).decode("ascii")
    except (zmq.ZMQError, ValueError) as exc:
        raise KeyFileError(f"{path}: the secret key does not decode ({exc})") from exc
    if derived != public:
        raise KeyFileError(f"{path}: the public key does not belong to the secret key")
    _warn_if_shared(Path(path))
    return KeyPair(public, secret)


def _warn_if_shared(path: Path) -> None:
    """Warn (not refuse: the key is already out) when others on this host may read a secret
    key file: whoever reads it can act as its owner. ``mpl-keys new`` makes them 0600."""
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning(
                "%s is readable by other users of this host (mode %04o): anyone who reads "
                "it can act as this key's owner. Run `chmod 600 %s`, and make a new key if "
                "someone may have copied it",
                path,
                mode,
                path,
            )


def _certificate(public: str, secret: str | None, name: str) -> str:
    kind = "secret" if secret else "public"
    lines = [
        f"#   **** Generated on {datetime.datetime.now():%Y-%m-%d %H:%M:%S} by mpl-keys ****",
        f"#   ZeroMQ CURVE {kind} certificate for {name!r}",
        "#   " + ("Keep this file private." if secret else "Give this file to the other parties."),
        "",
        "metadata",
        f"    name = {name}",
        "curve",
        f'    public-key = "{public}"',
    ]
    if secret:
        lines.append(f'    secret-key = "{secret}"')
    return "\n".join(lines) + "\n"


def write_keypair(
    directory: str | os.PathLike[str], name: str, *, overwrite: bool = False
) -> tuple[Path, Path, str]:
    """Make a new key pair as ``NAME.key`` and ``NAME.key_secret`` in ``directory``.

    Returns (public file, secret file, public key). The secret file is created with mode
    0600 (never readable by others, not even briefly). Existing files are kept unless
    ``overwrite``: replacing a key locks its owner out of every cluster that pins it.
    """
    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"key name {name!r}: use a plain file name such as 'node0'")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public_file, secret_file = folder / f"{name}.key", folder / f"{name}.key_secret"
    if not overwrite:
        for f in (public_file, secret_file):
            if f.exists():
                raise KeyFileError(
                    f"{f}: already exists; remove it first to make a new key (`mpl-keys new "
                    "--force` replaces it: every party that pinned the old key must then pin "
                    "the new one)"
                )
    public, secret = (k.decode("ascii") for k in zmq.curve_keypair())
    for f in (public_file, secret_file):
        f.unlink(missing_ok=True)
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(_certificate(public, secret, name))
    public_file.write_text(_certificate(public, None, name))
    return public_file, secret_file, public
