"""Who may read, replace or delete a persisted value (secure mode). No I/O.

A secure worker persists a value only on a sealed job's word (the ``save`` op of a job a
driver of its spec sealed; a ``SaveSymbol``, the broker's word, is refused), and writes
the job's sealer into the file as its owner (``mpl.wire.persist``, version 2). Then:

* it is read (fetched, bound as a job's input, loaded by a ``load`` op) only in a session
  that is bound on this worker to its owner (``mpl.worker.admission``): the owner's own
  sessions, and with them the drivers the owner shares such a session with, by its word;
* it is replaced or deleted only by a sealed job of its owner;
* to another driver it is no value at all (:func:`hidden`): a read of it in a session of
  that driver's, or a delete by that driver's job, answers exactly as for a name nothing
  is persisted under, so a driver's job cannot confirm a guessed name of another's by
  reading or deleting it. Its ``save`` of that name is refused, saying so: a save cannot
  pretend to be done, so that one still tells the name is taken here (not whose it is, nor
  what it holds);
* a file without an owner (persisted by an mpl from before owners were recorded, or by a
  plaintext worker) is neither read, replaced nor deleted by a secure worker: nothing says
  whose it is, so it is no one's (its operator removes it, and its owner saves it again).

A plaintext worker (``reader``/``writer`` None) checks nothing, as before: its drivers are
not authenticated.
"""

from __future__ import annotations

__all__ = ["hidden", "refuse_read", "refuse_write"]

_NO_OWNER = (
    "was persisted without an owner (by an mpl before owners were recorded, or by a "
    "plaintext worker): a secure worker lets no one use it; its operator removes the file "
    "and its owner saves the value again"
)


def hidden(owner: str | None, driver: str | None) -> bool:
    """Whether what is persisted for ``owner`` (None: nothing; "": no owner recorded) is
    another driver's to ``driver`` (a secure worker's session owner or sealed job's driver;
    "": none, the broker's word; None: plaintext, no rule), and so answered to it as no value
    at all. A file without an owner, and the broker's word, are refused as before, saying
    why: nothing says whose the file is (its operator is told to remove it), and the broker
    lists every name its workers hold anyway."""
    return bool(driver and owner and owner != driver)


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
