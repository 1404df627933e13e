"""ZeroMQ endpoints a user types (``--listen``, ``--broker``, ``mp.connect(url)``), checked
before any socket sees them.

libzmq's own answers to a mistyped endpoint do not say what to do, and some do not fail:
``127.0.0.1:5555`` (no ``tcp://``) is "Invalid argument" on a bind, and on a driver's
connect it raised in the heartbeat thread while the open waited for ever; a port past
65535 binds some other port without a word; ``http://`` is "Protocol not supported".
:func:`check_endpoint` refuses each with a ``ValueError`` that shows the form to write.
"""

from __future__ import annotations

__all__ = ["check_endpoint"]

_SCHEMES = ("tcp", "ipc", "inproc")
_FORM = "tcp://HOST:PORT (e.g. tcp://127.0.0.1:5555)"


def check_endpoint(url: object, *, bind: bool = False) -> str:
    """``url`` if it is an endpoint mpl can use, else ``ValueError`` saying what to write.

    ``tcp://HOST:PORT`` with a port from 1 to 65535 (when ``bind``, also 0 or ``*``: any
    free one; ``*`` as the host binds every interface), ``ipc://PATH`` or ``inproc://NAME``.
    """
    if not isinstance(url, str) or not url:
        raise ValueError(f"{url!r} is not an endpoint: write {_FORM}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"{url!r} has no transport: write tcp://{url}")
    if scheme not in _SCHEMES:
        raise ValueError(
            f"{url!r}: mpl speaks ZeroMQ, not {scheme}://; write {_FORM} "
            "(or ipc://PATH, inproc://NAME)"
        )
    if not rest:
        raise ValueError(f"{url!r} names no address: write {_FORM}")
    if scheme != "tcp":
        return url
    host, colon, port = rest.rpartition(":")
    if not colon or not host or host == "[]":
        raise ValueError(f"{url!r} names no port: write {_FORM}")
    if bind and port == "*":  # ZeroMQ's own spelling of "any free port"
        return url
    lowest = 0 if bind else 1
    if not (port.isascii() and port.isdigit()) or not lowest <= int(port) <= 65535:
        what = "0 (any free port) to 65535" if bind else "1 to 65535"
        raise ValueError(f"{url!r}: the port must be a number from {what}")
    return url
