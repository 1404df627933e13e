"""Who a driver is in plaintext mode: the name its sockets carry in their routing ids.

In secure mode a driver's identity is its key (``driver:<name>`` from the ZAP handler, see
:mod:`mpl.wire.identity`). Without keys nothing is authenticated, so daemons bind loopback or
inproc only, and the broker takes a driver's word for its name: every driver socket sets
its ZeroMQ routing id to ``drv:<name>/<nonce>`` before connecting, and the broker reads
the name off the routing id of each message it receives. The nonce keeps the routing ids
of one driver's sockets (one per thread, plus the heartbeat) distinct.

A name is declared, not proven: on a shared host, any local process could claim it. That
is acceptable only because plaintext never leaves the machine. A socket that sets no such
routing id (a raw DEALER) is an anonymous driver of its own, ``driver:~<routing id hex>``.
"""

from __future__ import annotations

import functools
import re
import secrets

from mpl.wire.identity import driver_identity

__all__ = ["ANONYMOUS_PREFIX", "check_driver_name", "driver_routing_id", "plaintext_identity"]

ANONYMOUS_PREFIX = "~"
_PREFIX = b"drv:"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")  # \Z: no final newline


def check_driver_name(name: str) -> str:
    """``name`` if it is a valid driver name (1-64 letters, digits, '.', '_', '-')."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"bad driver name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def driver_routing_id(name: str) -> bytes:
    """A fresh routing id for one socket of the driver called ``name``."""
    return _PREFIX + check_driver_name(name).encode() + b"/" + secrets.token_hex(6).encode()


@functools.lru_cache(maxsize=1024)  # asked for every message a driver sends; bounded
def plaintext_identity(peer: bytes) -> str:
    """The driver identity the routing id ``peer`` declares (unauthenticated)."""
    if peer.startswith(_PREFIX):
        name, _, _nonce = peer[len(_PREFIX) :].partition(b"/")
        try:
            return driver_identity(check_driver_name(name.decode()))
        except (UnicodeDecodeError, ValueError):
            pass
    return driver_identity(ANONYMOUS_PREFIX + peer.hex())
