"""Which drivers each session admits on this worker (secure mode), bound to its owner's
sealed word (``mpl.wire.session_word``), never to the broker's. No I/O.

* Only the driver a session's id names as its owner (``mpl.wire.session_word.session_id``:
  the broker draws it for the driver that opened the session, which checks it) binds the
  session here; a job of any other driver stating it owns the session, by any word, is
  refused. An id naming no owner (not of that form: an older broker's; no driver of this
  kind acts in one) binds to whichever owner's job comes first, as the rules below say.
* A job whose sealer states it owns the session (no word: it alone, as it opened it; or a
  stamped grant) binds the session to that driver when the session is not bound here yet
  (by no word: as a grant admitting the owner alone stamped with this worker's clock, so
  an older grant of the owner's, a job the broker held back from a session that had the
  same id, does not share it); in a session bound to that driver it runs, and its grant
  replaces the session's only if its stamp is higher than the one kept (a job the broker
  held back carries an older grant: it runs, and the newer grant stands); a session bound
  to another driver refuses it. One grant is kept per session (its stamp, its list), never a
  history.
* A job without a word (its client opened the session and made no grant: "it admits me
  alone") never runs under a kept grant that admits anyone else: its client's view is
  stale (another client of the owner shared the session since) or the broker gave it the
  id of another session of the owner's, a shared one. Refused: the owner's open, whose
  word job has no word either, fails loudly; its client re-attaches with ``share_with``.
* A grant older than what this worker forgot does not bind anew: each owner has a mark,
  this worker's start (wall-clock ns) raised to the stamp of every binding of that owner
  it evicted. A grant admitting anyone besides its owner binds a session not bound here
  only if stamped above its owner's mark (a taken-back share, its binding evicted or lost
  in a restart, is not shared again by an older grant of the owner's other client, or a
  job the broker held back); the owner re-attaches with ``share_with`` to grant anew. A
  grant admitting its owner alone, or no word, binds too (it lets no one in), stamped at
  least at the owner's mark, so no grant at or below the mark replaces it after. The
  mark compares the owner's clock with this worker's: an owner whose clock is behind this
  worker's by more than the worker has been up has its new grants refused until it is not.
* A grant flagged as opening its session (its client's open the broker answered as new)
  binds a session not bound here, or restates itself; it never replaces a binding it did
  not make (refused where it would: the broker gave that open the id of a session held
  here, an old private one, say, whose values its sharees must not read).
* A job admitted in a closed session (a close the broker forged) un-closes it, the
  owner's and a sharee's alike: a session in use is not evicted. A closed session is out
  of ``solo``, so the short path sends its next job to the full path, which un-closes it.
* A job that claims no say (a sharee's) runs only in a session bound here that admits its
  sealer; in a session not bound yet it is refused, saying the owner's word has not reached
  this worker.
* A fetch's reply is sealed only for a driver the session admits here.

So a hostile broker holding a listed driver key can no longer run that driver's jobs in
another's session, or have its values sealed for that driver, nor bind another's session
to that driver on a worker the owner's word has not reached (a worker that restarted, or
that the broker left out of the owner's open): the id names the owner. There the session
stays unbound until the owner's job comes, and its sharees' jobs (a client of the owner
attached without ``share_with`` too: it claims no say) are refused (a denial of service,
which the broker can always cause); no value of theirs is ever in a session bound to
another driver.

Bounded, failing closed: a binding is never dropped while its session may hold values
here (dropping it would let the next job bind the session anew): a closed session's
binding stays, evicted oldest first only to make room, after every later one; with no
closed one to evict, a new session is refused. The marks: one int per owner whose binding
was evicted (the drivers the spec lists: only they seal a job that opens).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mpl.wire.limits import MAX_SESSIONS
from mpl.wire.session_word import binds_owner

__all__ = ["SESSIONS_BOUND", "SessionAdmission"]

SESSIONS_BOUND = 2 * MAX_SESSIONS  # bindings kept, open sessions and closed ones


class SessionAdmission:
    """Sessions bound here: each to its owner and the drivers its owner's word admits."""

    def __init__(
        self, limit: int = SESSIONS_BOUND, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self._limit = limit
        self._clock = clock  # wall-clock ns, as the owners' grant stamps
        # when this worker started: every grant it held before is forgotten
        self.started = clock()
        # owner -> the highest stamp of its bindings evicted here (above started): a grant
        # admitting others and stamped at most this (or started) binds no session anew
        self._forgotten: dict[str, int] = {}
        # session -> owner, admitted, the stamp of the grant admitting them (bound by a job
        # without a word: this worker's clock then, the owner alone as it opened it)
        # and the stamp of the grant that made it if that grant was flagged as opening the
        # session (else 0): a flagged grant binds only anew or restating itself
        self._bound: dict[str, tuple[str, frozenset[str], int, int]] = {}
        # session -> owner, for every session bound to its owner alone and not closed: a
        # sealed None (no word) of that owner is admitted by one lookup here
        # (WorkerSeal.open_exec); a closed one takes the full path, which un-closes it
        self.solo: dict[str, str] = {}
        self._closed: dict[str, None] = {}  # closed sessions still bound, oldest first

    def __len__(self) -> int:
        return len(self._bound)

    def admit(
        self,
        session: str,
        driver: str,
        word: frozenset[str] | None,
        word_said: bool,
        stamp: int = 0,
        opening: bool = False,
    ) -> str:
        """Why a job of ``session`` that ``driver`` sealed may not run here ("" if it may).
        ``word_said``: its bindings carried a word, ``word`` (the drivers a grant stamped
        ``stamp`` admits, or None: a member's, claiming no say); without one it is the
        owner's word that the session admits it alone, as it opened it (stamp 0).
        ``opening``: the grant is of a client whose open the broker answered as new."""
        bound = self._bound.get(session)
        if word_said and word is None:  # a member: only where the owner's word admits it
            if bound is None:
                return (
                    f"{driver} acts in session {session} as a driver its owner shares it "
                    "with, but the owner's word on who the session admits has not reached "
                    "this worker: the owner runs a job on every rank when it opens a shared "
                    "session (an owner attaching without share_with passes it again)"
                )
            if driver not in bound[1]:
                return f"session {session} does not admit {driver} here (its owner's word)"
            if session in self._closed:  # in use: not evicted while it may make values
                self._unclose(session)
            return ""
        if bound is not None and bound[0] != driver:
            return f"session {session} belongs to another driver here, not to {driver}"
        # a grant flagged as opening its session never replaces a binding it did not make
        # (an older one runs under it: the newer grant stands, as for any grant)
        if opening and bound is not None and bound[3] != stamp and stamp > bound[2]:
            return (
                f"{driver}'s grant for session {session} opens it as a new session, but "
                "this worker already holds a session of that id: the broker gave this open "
                "the id of a session this worker holds; open under a new name"
            )
        if not word_said and bound is not None and len(bound[1]) > 1:
            return (
                f"session {session} is shared here by a grant of {driver} that this client "
                "did not make (it opened the session without share_with, or was given "
                "another session's id): it admits no job without a word; re-attaching with "
                "share_with states whom the session admits"
            )
        if bound is None:
            if not binds_owner(session, driver):  # (the short path never binds: no cost)
                return (
                    f"session {session}'s id names another driver as its owner, not "
                    f"{driver}: only its owner binds it here"
                )
            if word is not None and not word <= {driver} and stamp <= self.forgotten(driver):
                return (
                    f"{driver}'s grant for session {session} is older than what this "
                    "worker remembers of its grants (it restarted, or made room since): "
                    "it binds nothing; the owner re-attaches with share_with to grant again"
                )
            if session not in self._closed and not self._room():
                return (
                    f"session {session} refused: this worker holds {len(self._bound)} "
                    "sessions' bindings, none closed (close sessions no longer used)"
                )
        if session in self._closed:  # its owner acts in it: not evicted while it may
            self._unclose(session)
        if bound is not None and stamp <= bound[2]:  # no newer grant: the kept one stands
            return ""
        granted = stamp if opening else 0  # what a flagged grant restating itself matches
        if bound is None:  # made anew: at least at the owner's mark, so no grant of the
            # owner's at or below it (what this worker forgot, a held-back job's, made
            # before the owner's no-word job bound it now) replaces it
            stamp = max(stamp if word_said else self._clock(), self.forgotten(driver))
        admitted = frozenset((driver,)) if word is None else word | {driver}
        self._bound[session] = (driver, admitted, stamp, granted)
        if len(admitted) == 1:
            self.solo[session] = driver
        else:
            self.solo.pop(session, None)
        return ""

    def may_read(self, session: str, driver: str) -> str:
        """Why a fetch of ``session``'s value may not be sealed for ``driver`` ("" if it
        may): only for a driver the session's owner admits, in a session bound here."""
        bound = self._bound.get(session)
        if bound is None:
            return f"session {session} ran no job here: its value is sealed for no driver"
        if driver not in bound[1]:
            return f"session {session} does not admit {driver} here (its owner's word)"
        return ""

    def forgotten(self, owner: str) -> int:
        """The stamp at or below which a grant of ``owner`` admitting others binds no
        session anew here: this worker's start, or the newest grant of ``owner``'s it
        evicted."""
        return self._forgotten.get(owner, self.started)

    def owner(self, session: str) -> str:
        """The driver ``session`` is bound to here ("": none), whose persisted values alone
        it reads (``mpl.worker.symbol_owner``)."""
        bound = self._bound.get(session)
        return bound[0] if bound is not None else ""

    def closed(self, session: str) -> None:
        """``session`` closed (the broker's word): its binding stays until room is needed,
        after every session closed before it; out of ``solo`` until a job un-closes it."""
        if session in self._bound:
            self._closed.pop(session, None)
            self._closed[session] = None
            self.solo.pop(session, None)

    def all_closed(self) -> None:
        """Every session closed at once (a new broker welcomed this worker, which closed
        them all here): each binding evictable, as if its close had come."""
        for session in self._bound:
            self._closed.pop(session, None)
            self._closed[session] = None
        self.solo.clear()

    def _unclose(self, session: str) -> None:
        """A job admitted in ``session`` (the broker's close was forged, or the session
        reopened): its binding is not evicted while it may hold values; a session bound to
        its owner alone is back in ``solo`` (the short path never sees a closed one)."""
        del self._closed[session]
        bound = self._bound.get(session)
        if bound is not None and len(bound[1]) == 1:
            self.solo[session] = bound[0]

    def _room(self) -> bool:
        """Whether one more session can be bound, evicting the oldest closed one if full."""
        if len(self._bound) < self._limit:
            return True
        if not self._closed:
            return False
        oldest = next(iter(self._closed))
        del self._closed[oldest]
        evicted = self._bound.pop(oldest, None)
        self.solo.pop(oldest, None)
        if evicted is not None and evicted[2] > self.forgotten(evicted[0]):
            self._forgotten[evicted[0]] = evicted[2]  # its grants up to this one: forgotten
        return True
