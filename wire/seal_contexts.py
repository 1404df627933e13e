"""The contexts a sealed payload is bound to (``mpl.wire.seal``): what it is for, written
into its key or its associated data, so that one replayed into another job, request,
output slot, direction or worker process does not open.

* ``program|digest``: a job's program.
* ``exec|job|tail|incarnation``: one rank's bindings of a job, everything else in the
  ``Exec`` and the recipient worker's public incarnation; ``tail`` stands for
  ``session|digest|ranks|inline|timeout``, by a hash of it (:class:`ExecTails`).
* ``done|session|job|index``: one inline output of a job. No rank: the sender's key pins
  it (a worker is one rank; the driver opens a rank's value only as its node's, and keeps
  each node at one rank: ``DriverSeal.bind``), so no Done grows by a rank per job.
* ``fetch|<len>:session|rank|<len>:uri|ticket``: one fetch's reply (:func:`fetch_context`).

The driver's and the worker's hot paths write the Exec and Done contexts out themselves
(a Python call less per job); :func:`pin_contexts` checks at their import that they write
them as this module does.
"""

from __future__ import annotations

import hashlib
from base64 import urlsafe_b64encode

__all__ = [
    "ExecKey",
    "ExecTails",
    "done_context",
    "exec_context",
    "fetch_context",
    "incarnation_suffix",
    "pin_contexts",
    "program_context",
]


def program_context(digest: str) -> str:
    return f"program|{digest}"


def exec_context(
    session: str,
    job: str,
    digest: str,
    ranks: tuple[int, ...],
    inline: tuple[int, ...],
    timeout: float,
    incarnation: str = "",
) -> str:
    """Everything in an ``Exec`` besides the bindings is bound too: the broker cannot change
    which ranks take part, what comes back inline, or the job's deadline. So is the
    recipient worker's public ``incarnation`` (``mpl.wire.incarnation``; "" where none is
    known): an Exec sealed for one process start never opens in another, so a worker
    that restarted, and so remembers none of the Execs it ran, cannot be made to run a
    recorded one again. Each rank's bindings are sealed under its own worker's."""
    # one string built, not three (the hot paths write this line out, with ExecTails)
    tail = _EXEC_TAILS[(session, digest, ranks, inline, timeout)]
    return f"exec|{job}{tail}{incarnation_suffix(incarnation)}"


def incarnation_suffix(incarnation: str) -> str:
    """What ends an Exec context for a worker of public ``incarnation``: written once per
    worker (a hot path appends it to the job's context for that worker's rank)."""
    return f"|{incarnation}"


# session, digest, ranks, inline, timeout
ExecKey = tuple[str, str, tuple[int, ...], tuple[int, ...], float]


class ExecTails(dict[ExecKey, str]):
    """The part of :func:`exec_context` after the job, by (session, digest, ranks, inline,
    timeout): the same for every job of one call site in one session, so written once. A
    hot path writes ``f"exec|{job}{tails[key]}"`` itself, as exec_context does (one Python
    call less per job). Bounded: keyed by what a broker sends.

    The tail is ``|`` and a 24-byte BLAKE2b hash of the session and digest (each after its
    length, so no two splits read alike), ranks, inline outputs and timeout (32 characters),
    not that text (about 130): it binds the same fields (finding another tail of the same
    hash is a 192-bit second preimage, and only the driver chooses the tails it seals
    under), and it keeps a sealed None's tag input (its 32-byte key, nonce and context) in
    one BLAKE2b block (``mpl.wire.seal_box``) instead of two, in the driver per rank and in
    every worker, per job. The session went into the hash when its id grew to
    ``<name>~<16 hex digits>``: written out, it pushed that input past one block."""

    def __missing__(self, key: ExecKey) -> str:
        session, digest, ranks, inline, timeout = key
        if len(self) >= _EXEC_TAILS_KEPT:
            self.clear()  # a bound, not a policy: they are cheap to write again
        fields = (
            f"|{len(session)}:{session}|{len(digest)}:{digest}"
            f"|{list(ranks)}|{list(inline)}|{float(timeout)!r}"
        ).encode()
        hashed = hashlib.blake2b(fields, digest_size=24, person=_TAIL_PERSON).digest()
        tail = self[key] = "|" + urlsafe_b64encode(hashed).decode()
        return tail


_TAIL_PERSON = b"mpl-exec-tail/2"  # keeps these hashes apart from any other BLAKE2b use
_EXEC_TAILS = ExecTails()
_EXEC_TAILS_KEPT = 256


def done_context(session: str, job: str, index: int) -> str:
    return f"done|{session}|{job}|{index}"


def pin_contexts(user: str) -> None:
    """For a hot path that writes Exec and Done contexts out itself, as
    ``f"exec|{job}{tails[key]}{suffix}"`` (``suffix``: the recipient's
    :func:`incarnation_suffix`, written once per worker) and ``f"done|{session}|{job}|{index}"``
    (a Python call less per job): raise ImportError, naming ``user``, if :func:`exec_context`
    or :func:`done_context` no longer write them so. Called once, at ``user``'s import."""
    tail = ExecTails()[("s1", "d1", (0, 1), (1,), 2.5)]
    written = "exec|j1" + tail + incarnation_suffix("i1")
    if exec_context("s1", "j1", "d1", (0, 1), (1,), 2.5, "i1") != written:
        raise ImportError(f"{user} writes Exec contexts unlike mpl.wire.seal")
    if done_context("s1", "j1", 3) != "done|s1|j1|3":
        raise ImportError(f"{user} writes Done contexts unlike mpl.wire.seal")


def fetch_context(session: str, rank: int, uri: str, ticket: str) -> str:
    """The session and uri each after its length, as the Exec tail's fields are: both are
    free (a session's name may hold ``|``, a job id, so a uri, is any string a listed
    driver seals), so written bare, one fetch's fields could be split as another's (a
    session named after another's id and a rank, against a uri holding the rest) and the
    broker could have a driver open another fetch's reply as its own. The rank is an int
    and the ticket comes last, so with these two prefixed every context reads one way.
    Written out, not hashed: a fetch's key derivation (a keyed BLAKE2b of the 16-byte salt
    and this context, ``mpl.wire.seal``) stays in one block for a session ``mp.connect``
    names (``s`` and 16 hex digits: 124 bytes of 128, at a rank below 10, of an output
    below 10 of a job, with this driver's 24-character ticket), and names up to 21
    characters (27 before the prefixes)."""
    return f"fetch|{len(session)}:{session}|{rank}|{len(uri)}:{uri}|{ticket}"
