"""Who may read, replace or delete a persisted value (secure mode). No I/O.

A secure worker persists a value only on a sealed job's word (the ``save`` op of a job a
driver of its spec sealed; a ``SaveSymbol``, the broker's word, is refused), and writes
the job's sealer into the file as its owner (``mpl.wire.persist``, version 2). Then:

* it is read (fetched, bound as a job's input, loaded by a ``load`` op) only in a session
  that is bound on this worker to its owner (``mpl.worker.admission``): the owner's own
  sessions, and with them the drivers the owner shares such a session with, by its word;
* it is replaced or deleted only by a sealed job of its owner;
* a file without an owner (persisted by an mpl from before owners were recorded, or by a
  plaintext worker) is neither read, replaced nor deleted by a secure worker: nothing says
  whose it is, so it is no one's (its operator removes it, and its owner saves it again).

A plaintext worker (``reader``/``writer`` None) checks nothing, as before: its drivers are
not authenticated.
"""

from __future__ import annotations

__all__ = ["refuse_read", "refuse_write"]

_NO_OWNER = (
    "was persisted without an owner (by an mpl before owners were recorded, or by a "
    "plaintext worker): a secure worker lets no one use it; its operator removes the file "
    "and its owner saves the value again"
)


def refuse_read(name: str, owner: str, reader: str | None) -> str:
    """Why the value persisted as ``name`` by ``owner`` ("": none recorded) may not be read
    in a session bound here to ``reader`` ("": bound to no one; None: plaintext, no rule),
    or "" if it may."""
    if reader is None:
        return ""
    if not owner:
        return f"the value persisted as {name!r} {_NO_OWNER}"
    if not reader:
        return (
            f"the value persisted as {name!r} is read only in its owner's sessions, and "
            "this session is bound to no driver here"
        )
    if owner != reader:
        return (
            f"the value persisted as {name!r} belongs to another driver than this session's "
            f"owner {reader}: it is read only in its owner's sessions"
        )
    return ""


def refuse_write(name: str, owner: str | None, writer: str | None) -> str:
    """Why ``writer`` (a sealed job's driver; None: plaintext, no rule) may not replace or
    delete what is persisted as ``name``, owned by ``owner`` (None: nothing there; "": a
    file without an owner), or "" if it may."""
    if writer is None or owner is None or (writer and owner == writer):
        return ""  # ("" == "": the broker's word is no owner's, not even a file's without one)
    if not writer:
        return f"the value persisted as {name!r} is replaced or deleted only by its owner"
    if not owner:
        return f"the value persisted as {name!r} {_NO_OWNER}"
    return f"the value persisted as {name!r} belongs to another driver than {writer}"
