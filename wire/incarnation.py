"""A worker's incarnation: a secret drawn per process start, and its public digest.

The secret goes only to the broker (in ``WorkerHello``), which lets the same process
re-register from a new socket or add a result channel with it. Peers and drivers learn only
the digest (:func:`public_incarnation`): it names the process start without letting anyone
speak for it. A driver binds what it seals for a worker to that worker's public
incarnation (``mpl.wire.seal.exec_context``), so an Exec recorded before a restart never
opens after it. Both the broker and the worker compute it, hence here in ``mpl.wire``.
"""

from __future__ import annotations

import hashlib

__all__ = ["PUBLIC_INCARNATION_CHARS", "public_incarnation"]

PUBLIC_INCARNATION_CHARS = 16  # hex digits of a public incarnation


def public_incarnation(incarnation: str) -> str:
    """What peers learn of a worker's incarnation: new per process start, not replayable."""
    digest = hashlib.sha256(b"mpl-incarnation:" + incarnation.encode()).hexdigest()
    return digest[:PUBLIC_INCARNATION_CHARS]
