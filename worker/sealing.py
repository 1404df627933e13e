"""The worker's end of end-to-end sealing (secure mode): what the broker hands it is opened
here, what it hands the broker for a driver is sealed here. No I/O.

* A ``Program`` opens only if a driver of this worker's own spec sealed it for this rank
  and this digest; otherwise it is never cached, and a job naming it fails with
  ``AuthenticationError`` (``mpl.worker.sealed_programs``).
* An ``Exec`` runs only with its bindings sealed for this rank and this (session, job,
  digest) by such a driver: the broker cannot start a job, replay one into another job, or
  swap one rank's inputs for another's. That driver is remembered as the job's recipient
  (the last 4,096 jobs opened; held for as long as the job pool holds the job, however
  many open meanwhile, up to 4,096 per driver, so no driver's jobs push out another's:
  ``hold``, ``release``).
  Nor can it replay a job: the bindings carry their sealer's sequence number, and a window
  of those per stream (``mpl.wire.replay``) lets each run once, however many jobs ran since
  and whether or not its session is still open; they are sealed for this worker process
  (its public incarnation), so none recorded before a restart opens after it, and a
  stream this worker forgot stays refused (its floor). Most jobs' bindings are a sealed
  None numbered next in a stream that ran here: those are checked and admitted in
  ``WorkerSeal.open_exec`` itself, by one lookup of their head (the same tag and window
  checks; anything else takes the full path, which says why it refuses).
* ``Done`` values and fetch ``Reply`` values are sealed for the driver that asked, bound to
  the job and output index, or to the fetch's ticket. A fetch's value is sealed by the
  ``Fetch`` the job shell read and answered (:meth:`WorkerSeal.reply`), never looked up by
  its ``req``: that number is the broker's to choose, and may name another fetch by then.
* Who a session admits is its owner's sealed word, never the broker's
  (``mpl.worker.admission``): an Exec that opened runs only if the session is bound here to
  its sealer, or to an owner whose word admits it (the first job of a session binds it); a
  fetch's value is sealed only for a driver the session admits, by the newest grant of its
  owner seen here. A sealed None on the short path is its owner's job without a word
  (which changes no grant): it runs there only in a session bound to its sealer alone (one
  lookup per new Exec record; a repeat, an identity comparison).

Everything a hostile broker could send here is refused before any pickle in it is loaded:
the daemon decodes broker traffic with the safe format, and sealed plaintext is decoded
only after it authenticated. Under ``--code kernels`` a driver's sealed program or bindings
holding pickles open with the pickles left opaque, for the daemon to refuse by its policy:
the seal hides them from the check it makes on the outer message.

A driver the worker's own spec lists with ``code: kernels`` (``kernels_drivers``) is held
to that policy on a ``--code any`` worker too, by its authenticated sealer
(``mpl.worker.kernels_drivers``). Its jobs always take :meth:`open_exec`'s full path, which
makes those checks; the other drivers' jobs pay nothing for it.
"""

from __future__ import annotations

from hmac import compare_digest
from typing import Any

from mpl.wire.data import Fetch
from mpl.wire.errors import AuthenticationError, ProtocolError, SessionAccessError
from mpl.wire.jobs import Done, Exec, Failed, Program
from mpl.wire.record import Record, pinned_fields
from mpl.wire.remote import ErrorInfo, to_info
from mpl.wire.replay import (
    UNKNOWN_STREAM,
    ReplayGuard,
    claimed_stream,
    refusal_facts,
    stamp,
)
from mpl.wire.safe_values import WORKER, pickles_allowed
from mpl.wire.seal import (
    ExecTails,
    Sealer,
    fetch_context,
    incarnation_suffix,
    pin_contexts,
)
from mpl.wire.sealed import BOX_MAGIC
from mpl.wire.session_word import read_word
from mpl.wire.sessions import Reply, SessionClosed
from mpl.worker.admission import SessionAdmission
from mpl.worker.code_policy import open_sealed
from mpl.worker.held_recipients import HeldRecipients
from mpl.worker.kernels_drivers import KernelsDrivers
from mpl.worker.sealed_programs import SealedPrograms

__all__ = ["WorkerSeal"]

_MEMORY = 4096  # jobs' recipients remembered (bounded)
_HEADS = 256  # streams whose next sealed None opens on open_exec's short path (each
# keeps its replay window, 4 KiB, alive while it is here)
_TAG = 16  # a sealed None's tag (mpl.wire.seal): its box's last bytes
_NONE_TRAILER = 12 + _TAG  # a sealed None's nonce (its number) and tag, after its head
_NONCE_AT, _TAG_AT = -_NONE_TRAILER, -_TAG  # where they start, from a sealed None's end
_BOX_HEAD = len(BOX_MAGIC) + 1 + 16  # a box's head but for its sender's name
_NO_CONTEXT: tuple[Exec | None, bytes, bytes, str] = (None, b"", b"", "")
_NO_JOB = ("", "", "")  # WorkerSeal._fresh when its last job's recipient is booked or done with
# a sealed None's number from its nonce (big-endian): int.from_bytes bound once, not looked
# up as a classmethod per job (about 0.6k instructions)
_number = int.from_bytes

# WorkerSeal sets a field of these records in place, in their __dict__ (a record that only
# stores its fields, direct): pinned here
_EXEC_FIELDS = pinned_fields(
    Exec,
    ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s"),
    "mpl.worker.sealing",
    direct=True,
)
_DONE_FIELDS = pinned_fields(
    Done,
    ("session", "job", "rank", "values", "stats", "metas", "saved"),
    "mpl.worker.sealing",
    direct=True,
)


# inbound and outbound write out the contexts exec_context and done_context write
pin_contexts("mpl.worker.sealing")


class _Replayed(AuthenticationError):
    """A sealed Exec that authenticated but may not run (again) here, and why."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Unopened(AuthenticationError):
    """Sealed bindings that did not open, of a stream this worker does not know: perhaps
    sealed for another process on this rank (this one restarted, or the driver learnt no
    incarnation yet). Its message ends with the facts the driver needs to seal for this
    one (``mpl.wire.replay.refusal_facts``)."""


class _SealedReply(Reply):
    """A fetch's ``Reply`` whose value :meth:`WorkerSeal.reply` sealed for the ``Fetch`` it
    answers (the same record on the wire): the only kind of ``Reply`` with a value that
    :meth:`WorkerSeal.outbound` lets go."""


class WorkerSeal:
    """Opens inbound payloads and seals outbound ones for rank ``rank``, in the worker
    process of public ``incarnation`` (``mpl.wire.incarnation``): only Execs sealed for it
    open here."""

    def __init__(
        self,
        sealer: Sealer,
        rank: int,
        *,
        trusted: bool = False,
        code: str = "any",
        incarnation: str = "",
        kernels_drivers: frozenset[str] = frozenset(),
    ) -> None:
        self.sealer = sealer
        self.rank = rank
        self.incarnation = incarnation
        self._bound = incarnation_suffix(incarnation)  # what ends an Exec context for us
        self._kernels_only = code == "kernels"  # mpl-worker --code kernels
        # drivers this worker's own spec lists with ``code: kernels`` (identities): on a
        # --code any worker their payloads open screened, as every one does under kernels
        self.kernels_drivers = frozenset() if self._kernels_only else frozenset(kernels_drivers)
        self._screens = self._kernels_only or bool(self.kernels_drivers)
        self._kernels = KernelsDrivers(self.kernels_drivers)  # what they may not run here
        self.safe = not pickles_allowed(WORKER, trusted=trusted)  # results leave this party
        # (session, job) of the jobs opened here last -> the driver that sealed it, its
        # results' recipient ("" once the job failed or was aborted): a plain dict, oldest
        # first, at most _opened_limit (every job enters it once, as the newest)
        self._opened: dict[tuple[str, str], str] = {}
        self._opened_limit = _MEMORY
        # (session, job, driver) of the job open_exec's short path opened last (the newest
        # opened), booked into _opened only when the next one is opened, unless its results
        # were sealed meanwhile: a job run inline has its Done sealed (sealed_scalars) before
        # the next one is read, so most jobs never enter _opened. Written by the I/O thread
        # alone (open_exec, sealed_scalars); any thread reads it before _opened (recipient).
        self._fresh: tuple[str, str, str] = _NO_JOB
        # the recipients of the jobs handed to the job pool (queued or running), held until
        # the pool is done with each: _opened forgets its oldest as jobs open
        # (mpl.worker.held_recipients); _held is its table, read by single lookups
        self._held_recipients = HeldRecipients()
        self._held = self._held_recipients.by_job
        # the _fresh that forget cleared (by identity: each opened job has its own tuple)
        self._dropped: tuple[str, str, str] = _NO_JOB
        # the _fresh whose answer sealed_scalars sealed last: its Done is packed from its
        # fields, unless they do not pack (a stats blob of 1 KiB or more): then outbound
        # seals the Done record, and finds its recipient here
        self._answered: tuple[str, str, str] = _NO_JOB
        self.replays = ReplayGuard()  # which sealed Execs ran: each runs once
        # which drivers each session admits here, by its owner's sealed word; and its
        # sessions admitting their owner alone (open_exec's short path: one lookup)
        self.admission = SessionAdmission()
        self._solo = self.admission.solo
        # the programs sealed for this rank: each opened as it arrives, and which were
        # refused, why (mpl.worker.sealed_programs); _refused is its table of those, read by
        # single lookups (open_exec's short path: whether it is empty)
        self._programs = SealedPrograms(sealer, rank, self._kernels)
        self._refused = self._programs.refused
        self._exec_refusals = 0  # Execs refused here (refusals: programs too)
        # the last refusal open_exec made (by identity): the refused Exec named a job the
        # broker chose, perhaps one that opened before and runs, so sealing it forgets
        # nothing (the I/O thread sends each refusal as soon as it is made)
        self._refused_exec: Failed | None = None
        self._tails = ExecTails()  # what exec_context writes after the job
        # a sealed None's head (magic, driver, epoch) -> (the replay guard, the driver, its
        # None's tag hash, its streams in the guard, the stream's epoch, its window, the
        # slot mask): heads of streams whose Nones authenticated and ran here (open_exec's
        # one lookup per job), each for the guard it was learnt with
        self._heads: dict[bytes, tuple[ReplayGuard, str, Any, Any, bytes, list[Any], int]] = {}
        # the last Exec a context was written for, its bytes before and after the job, and
        # the driver whose sealed None opened for it, its session bound here to it alone
        # (unset whenever a binding may change: _open_exec)
        self._context: tuple[Exec | None, bytes, bytes, str] = _NO_CONTEXT

    @property
    def refusals(self) -> int:
        """Execs and programs refused here."""
        return self._exec_refusals + self._programs.refusals

    def inbound(self, msg: Record) -> tuple[Record | None, Record | None]:
        """``(message to act on, or None; answer for the broker, or None)``.

        An ``Exec`` that opens (:meth:`open_exec`) comes back itself, its sealed bindings
        replaced by what they held (the caller acts on it instead)."""
        if type(msg) is not Exec and not isinstance(msg, Exec):
            return self._inbound_other(msg)
        mine = self.open_exec(msg, msg.job, msg.bindings.get(self.rank))
        if type(mine) is Failed:
            return None, mine
        # the broker's Exec with the bindings that opened, in their place: it was decoded
        # for this call alone (the daemon reads a new record per message and drops it for
        # the one returned), and a field set so costs no record built (_EXEC_FIELDS)
        msg.__dict__["bindings"] = {self.rank: mine} if mine is not None else {}
        return msg, None

    def open_exec(self, msg: Exec, job: str, sealed: Any) -> Any:
        """This rank's bindings of job ``job``, ``sealed`` for it: ``msg`` but for its job id
        and bindings (the job's own ``Exec``, or the program's last one: a repeat read by
        comparison, ``RepeatExecs.repeat_box``, needs no record of its own). What they held
        (a list, or None: no inputs) if they open, were sealed for this worker by a driver
        of its spec for exactly this job, and never ran here; otherwise the ``Failed`` to
        answer with, saying why (a record, never a list or None).

        Most jobs' bindings are a sealed None (a tag alone) of a stream that ran here
        before, numbered next: those are accepted here with one lookup (their head: the
        stream's driver, tag key and replay window, kept once such a box of it opened on
        the full path) and the tag checked as ``Sealer.open_box`` checks it, the number
        admitted as ``ReplayGuard.admit`` admits the next one. Anything else, or anything
        that does not pass, takes the full path (``_open_exec``), which refuses it saying
        why."""
        known = self._heads.get(sealed[:_NONCE_AT]) if type(sealed) is bytes else None
        if known is not None and not self._refused and known[0] is self.replays:
            _, driver, mark, streams, epoch, window, slot = known
            nonce = sealed[_NONCE_AT:_TAG_AT]
            seq = _number(nonce)  # (big-endian, as admit reads a box's number)
            if seq == window[0] + 1:
                context = self._context
                # another program's, an Exec read in full, or another driver's sealed None
                if msg is not context[0] or driver is not context[3]:
                    # a sealed None (no word: it changes no grant) runs on this path
                    # only in a session bound here to its sealer alone (SessionAdmission)
                    if self._solo.get(msg.session) != driver:
                        return self._open_exec(msg, job, sealed)
                    # exec_context's bytes before and after the job id, written once
                    fields = (msg.session, msg.digest, msg.ranks, msg.inline, msg.timeout_s)
                    after = f"{self._tails[fields]}{self._bound}"
                    context = (msg, b"exec|", after.encode(), driver)
                    self._context = context
                tagger = mark.copy()  # as open_box checks a None's tag: over nonce, context
                tagger.update(b"".join((nonce, context[1], job.encode(), context[2])))
                if compare_digest(sealed[_TAG_AT:], tagger.digest()):
                    try:
                        streams.move_to_end(epoch)  # still a stream the guard knows
                    except KeyError:  # evicted since: the full path refuses it
                        self._heads.pop(sealed[:_NONCE_AT], None)  # (and its window goes)
                    else:
                        window[0] = seq  # admitted, as admit() admits the next number
                        window[1][seq & slot] = 1
                        fresh = self._fresh
                        if fresh[2]:  # its results not sealed yet: _book_fresh, written out
                            opened = self._opened
                            key = (fresh[0], fresh[1])
                            opened[key] = fresh[2]
                            if fresh is self._dropped:  # forgotten, before or meanwhile
                                opened[key] = ""
                            if len(opened) > self._opened_limit:
                                opened.pop(next(iter(opened)), None)
                        self._fresh = (msg.session, job, driver)
                        return None
        return self._open_exec(msg, job, sealed)

    def _open_exec(self, msg: Exec, job: str, sealed: Any) -> Any:
        """:meth:`open_exec`'s full path: every payload, every check, every refusal."""
        session = msg.session
        try:
            refused = self._refused.get(msg.digest) if self._refused else None
            if refused is not None:
                raise AuthenticationError(f"program {msg.digest} was refused: {refused}")
            # exec_context(...) without its call
            tail = self._tails[(session, msg.digest, msg.ranks, msg.inline, msg.timeout_s)]
            context = f"exec|{job}{tail}{self._bound}"
            try:  # (no cost in Python 3.11 unless it raises)
                if self._screens:
                    driver, mine = self._open(sealed, context)
                elif type(sealed) is bytes:  # a compact box (every job without large inputs)
                    driver, mine = self.sealer.open_box(sealed, context, "", False, True)
                else:  # what _open does then, without its call: this runs for every job
                    driver, mine = self.sealer.open(sealed, context, safe=False)
            except AuthenticationError as exc:
                raise self._unopened(exc, sealed) from None
            replayed = self.replays.admit(driver, sealed)  # authenticated: counted as run
            if replayed:
                raise _Replayed(f"job {job} refused: {replayed}", replayed)
            if self.kernels_drivers and driver in self.kernels_drivers:
                refused_code = self._kernels.refusal(msg.digest, job, mine, self.rank)
                if refused_code is not None:  # (run: stays refused; binds no session)
                    return self._refusal(Failed(session, job, self.rank, refused_code))
            word, stamp, said = None, 0, type(mine) is dict  # its sealer's word on who S admits
            opening = False
            if said:
                word, stamp, opening, mine = read_word(mine)
            if mine is not None and type(mine) is not list:
                raise ProtocolError("a job's sealed bindings are not a list")
            # after admit: a job refused here stays run, and never opens in a session
            # bound here later
            refused_by = self.admission.admit(session, driver, word, said, stamp, opening)
            self._context = _NO_CONTEXT  # a binding may have changed: the short path checks
            if refused_by:
                raise SessionAccessError(f"job {job} refused: {refused_by}")
            # a job the pool holds keeps its sealer: another driver's job under its id (a
            # sharee's, the broker's doing) would take its recipient, its folder and Done
            if self._held and (held := self._held.get((session, job))) and held != driver:
                raise SessionAccessError(f"job {job} refused: its id is another driver's job here")
        except (AuthenticationError, ProtocolError, SessionAccessError) as exc:
            self._exec_refusals += 1
            kind, op = type(exc).__name__, "inputs"
            message = str(exc)
            if type(exc) is SessionAccessError:  # its owner's word does not admit it here
                op = "session"
            elif type(exc) is _Replayed:
                kind = "AuthenticationError"
                if exc.reason.startswith(UNKNOWN_STREAM):  # the driver starts a new stream
                    op = UNKNOWN_STREAM
                    message += refusal_facts(self.incarnation, self.replays.floor(driver))
            elif type(exc) is _Unopened:  # perhaps sealed for another incarnation of ours
                kind, op = "AuthenticationError", UNKNOWN_STREAM
            info = ErrorInfo(kind, message, rank=self.rank, op=op, job=job)
            return self._refusal(Failed(session, job, self.rank, info))
        fresh = self._fresh
        if fresh[2]:  # opened before this one: booked first
            self._book_fresh(fresh)
            self._fresh = _NO_JOB
        self._book(session, job, driver)
        # (a kernels driver's jobs keep to the full path, which checks their program)
        if (
            mine is None
            and not self._kernels_only
            and type(sealed) is bytes
            and driver not in self.kernels_drivers
        ):
            self._learn_head(driver, sealed)
        return mine

    def _book(self, session: str, job: str, driver: str) -> None:
        """Remember the recipient of a job opened here (the newest opened: its sealer numbers
        each job once, and a replay is refused), so it goes in last; past the bound the
        oldest goes (the first a dict iterates): no LRU to keep in order (an OrderedDict's set
        cost more)."""
        booked = self._opened
        booked[(session, job)] = driver
        if len(booked) > self._opened_limit:
            booked.pop(next(iter(booked)), None)

    def _book_fresh(self, fresh: tuple[str, str, str]) -> None:
        """Book ``fresh`` (the job opened last, as another is opened), cleared if ``forget``
        cleared it. ``forget`` may run on another thread meanwhile: it marks ``fresh``
        dropped, then clears what is booked; the mark is read here after the driver is
        booked, so a mark made too late to be seen here is followed by forget's clearing."""
        self._book(fresh[0], fresh[1], fresh[2])
        if fresh is self._dropped:
            self._opened[(fresh[0], fresh[1])] = ""

    def recipient(self, session: str, job: str) -> str:
        """The driver that sealed job ``job`` of ``session`` for this worker, its results'
        recipient; "" for a job not opened here (or forgotten), one that failed or was
        aborted, or one whose results were sealed already (sealed_scalars). Any thread."""
        fresh = self._fresh  # read first: it is booked before it is replaced
        if fresh[1] == job and fresh[0] == session:  # the newest opened
            return "" if fresh is self._dropped else fresh[2]
        driver = self._opened.get((session, job))
        if driver is None:  # not among the last opened: perhaps a job the pool holds
            return self._held.get((session, job), "")
        return driver

    def hold(self, session: str, job: str) -> str:
        """Hold the recipient of job ``job`` of ``session``, handed to the job pool, until
        :meth:`release`: it stays the job's however many jobs open meanwhile, while it
        waits its turn and while it runs (its moves carry it; its Done is sealed for it).
        Returns it ("" and nothing held for a job with none: :meth:`recipient`)."""
        driver = self.recipient(session, job)
        if driver:
            self._held_recipients.hold((session, job), driver)
        return driver

    def release(self, session: str, job: str) -> None:
        """The job pool is done with job ``job`` of ``session`` (its answer, if any, was
        sealed): its recipient is held no longer. Any thread."""
        self._held_recipients.release((session, job))

    def _learn_head(self, driver: str, sealed: bytes) -> None:
        """Keep the head of a sealed None that authenticated and was admitted here, for
        :meth:`open_exec` to accept its stream's next ones with (bounded: cleared when
        full; the full path learns them again)."""
        head = sealed[:_NONCE_AT]
        if head in self._heads or len(sealed) < _BOX_HEAD + _NONE_TRAILER:
            return
        epoch_keys = self.sealer.opened_epoch(head)
        epoch = stamp(sealed)[0]
        if epoch_keys is None or epoch_keys[0] != driver:
            return  # (not a tag alone: a box of this head holds a ciphertext)
        streams, window = self.replays.stream(driver, epoch)
        if len(self._heads) >= _HEADS:
            self._heads.clear()
        slot = len(window[1]) - 1  # a number's slot in the window's ring: its low bits
        self._heads[head] = (self.replays, driver, epoch_keys[2], streams, epoch, window, slot)

    def _unopened(self, exc: AuthenticationError, sealed: Any) -> AuthenticationError:
        """Why sealed bindings did not open, for the refusal: if they claim a stream this
        worker does not know, with this worker's incarnation and that sender's floor."""
        claimed = claimed_stream(sealed)
        if claimed is None or self.replays.knows(*claimed):
            return exc  # a stream that ran here: the right incarnation, so a forgery
        sender, _ = claimed
        facts = refusal_facts(self.incarnation, self.replays.floor(sender))
        return _Unopened(f"{exc}; a stream this worker does not know{facts}")

    def _inbound_other(self, msg: Record) -> tuple[Record | None, Record | None]:
        if isinstance(msg, Program):
            return self._programs.open(msg, self._open), None
        if isinstance(msg, SessionClosed):
            self.admission.closed(msg.session)
            # the short path's cached context skips the solo lookup: the next job takes it
            # (a closed session is out of solo: the full path un-closes it)
            self._context = _NO_CONTEXT
        return msg, None

    def all_closed(self) -> None:
        """Every session closed at once (a new broker welcomed this worker): as for one
        session's close, the next job takes the full path, which un-closes its session."""
        self.admission.all_closed()
        self._context = _NO_CONTEXT

    def outbound(self, msg: Record) -> Record:
        """Seal what ``msg`` carries for its driver (results). A fetch's ``Reply`` goes only
        as :meth:`reply` sealed it (or with an error and no value): one with a plain value is
        answered with an error instead.

        A ``Done`` is sealed here, in this method, for the same reason as ``inbound``: it
        comes back itself, its values replaced by their sealed boxes."""
        if not isinstance(msg, Done):
            return self._outbound_other(msg)
        session, job = msg.session, msg.job
        fresh = self._fresh  # recipient(session, job), written out
        if fresh[1] == job and fresh[0] == session:
            driver = "" if fresh is self._dropped else fresh[2]
        else:
            booked = self._opened.get((session, job))
            # not among the last opened: perhaps a job the pool holds
            driver = self._held.get((session, job), "") if booked is None else booked
            answered = self._answered  # sealed inline, its Done not packed (rare)
            if not driver and answered[1] == job and answered[0] == session:
                driver = "" if answered is self._dropped else answered[2]
        if not driver:
            info = ErrorInfo(
                "AuthenticationError",
                f"job {msg.job} has no authenticated driver here to seal its results for",
                rank=self.rank,
                job=msg.job,
            )
            return Failed(msg.session, msg.job, self.rank, info)
        # done_context without its call (checked on import), but for the output's index
        prefix = f"done|{session}|{job}|"
        try:  # seal_scalars too: a str UTF-8 cannot encode fails there, as an unsafe value
            values: dict[int, Any] | None = self.sealer.seal_scalars(msg.values, driver, prefix)
            if values is None:  # not small scalars alone: each value sealed as it needs
                seal, safe, values = self.sealer.seal, self.safe, {}
                for index, value in msg.values.items():  # a loop: a comprehension is a call
                    values[index] = seal(value, driver, f"{prefix}{index}", safe)  # positional
        except Exception as exc:  # an unsafe value: the job fails with the reason
            info = to_info(exc, rank=self.rank, op="result", job=msg.job, with_traceback=False)
            return Failed(msg.session, msg.job, self.rank, info)
        # the values sealed in their place: the job built ``msg`` for this one message and
        # the caller sends what comes back instead (a field set so costs no record built)
        msg.__dict__["values"] = values
        return msg

    def sealed_scalars(
        self, session: str, job: str, values: dict[int, Any]
    ) -> dict[int, bytes] | None:
        """A job's Done values sealed for its driver, as :meth:`outbound` seals them, when
        they are all small scalars (``Sealer.seal_scalars``): for a Done packed from its
        fields (the inline path), with no record built. None when :meth:`outbound` must
        take the Done: other values, or no authenticated driver to seal for (it answers
        why).

        On the I/O thread (which opens jobs): the job opened last, sealed for here (most
        jobs: run inline just after it opened), has its one answer sealed now, so its
        recipient is dropped rather than booked (``_fresh``)."""
        fresh = self._fresh
        if fresh[1] == job and fresh[0] == session and fresh is not self._dropped:  # (most)
            sealed = self.sealer.seal_scalars(values, fresh[2], f"done|{session}|{job}|")
            if sealed is not None:  # its answer sealed: its recipient is not booked
                self._answered = fresh
                self._fresh = _NO_JOB
            return sealed
        driver = self.recipient(session, job)
        if not driver:
            return None
        return self.sealer.seal_scalars(values, driver, f"done|{session}|{job}|")

    def _refusal(self, failed: Failed) -> Failed:
        """``failed``, the answer to an Exec refused here: it was never booked, so when it
        goes out it forgets nothing (another job's under its id, the broker's doing, keeps
        its recipient)."""
        self._refused_exec = failed
        return failed

    def _outbound_other(self, msg: Record) -> Record:
        if isinstance(msg, Failed):
            if msg is not self._refused_exec:  # (a refusal: nothing of it was booked)
                self.forget(msg.session, msg.job)
        elif type(msg) is Reply and msg.error is None:  # a value not sealed by reply():
            why = f"fetch {msg.req}'s value was not sealed for the Fetch it answers: not sent"
            info = ErrorInfo("AuthenticationError", why, rank=self.rank, op="fetch")
            return Reply(msg.req, error=info)  # so never sent as it is
        return msg

    # -- inbound --------------------------------------------------------------------------
    def _open(self, sealed: Any, context: str) -> tuple[str, Any]:
        """Open what a driver sealed for this rank (pickles allowed: it is an allowed
        driver). Under ``--code kernels``, and for a driver listed with ``code: kernels``,
        nothing in it is unpickled: a payload holding pickles comes back with them opaque,
        for the caller to refuse; any other payload, holding none, opens as usual. Which
        driver sealed it is read from its claim before it opens: opening authenticates
        exactly that sender, or fails."""
        if self._kernels_only or (self._screens and self._kernels.claims(sealed)):
            return open_sealed(self.sealer, sealed, context)  # decoded once unless refused
        result: tuple[str, Any] = self.sealer.open(sealed, context, safe=False)
        return result

    def reply(self, fetch: Fetch, value: Any) -> Reply:
        """The ``Reply`` to ``fetch`` (the Fetch the job shell read, and answers: any thread)
        with ``value`` sealed for its driver under its context, if its session admits that
        driver; else one saying why, with no value. Bound to this Fetch itself, not to its
        ``req``: the broker numbers requests, and may reuse a number for a fetch in another
        session before this one is answered."""
        req = fetch.req
        refused_by = self.admission.may_read(fetch.session, fetch.reply_to)
        if refused_by:  # (the broker wrote reply_to: only the session's owner's word counts)
            why = f"a fetch of {fetch.uri} refused: {refused_by}"
            info = ErrorInfo("SessionAccessError", why, rank=self.rank, op="fetch")
            return Reply(req, error=info)
        if not self.sealer.knows(fetch.reply_to) or not fetch.ticket:
            return Reply(
                req,
                error=ErrorInfo(
                    "AuthenticationError",
                    f"a fetch of {fetch.uri} asks for a reply to {fetch.reply_to!r}, which is "
                    "not a driver this worker's cluster spec lists",
                    rank=self.rank,
                    op="fetch",
                ),
            )
        context = fetch_context(fetch.session, self.rank, fetch.uri, fetch.ticket)
        try:
            return _SealedReply(req, self.sealer.seal(value, fetch.reply_to, context, self.safe))
        except Exception as exc:
            return Reply(req, error=to_info(exc, rank=self.rank, op="fetch", with_traceback=False))

    def forget(self, session: str, job: str) -> None:
        """A job that ends without ``Done`` (failed, aborted) has no recipient any more (and
        stays remembered as run)."""
        answered = self._answered  # sealed inline, its Done perhaps still to seal
        if answered[1] == job and answered[0] == session:
            self._dropped = answered
        if self._held:  # held for the pool no more (a job that gets no Done)
            self.release(session, job)
        fresh = self._fresh
        if fresh[1] == job and fresh[0] == session:  # opened last, perhaps being booked now:
            self._dropped = fresh  # booked cleared from now on,
            self._opened[(session, job)] = ""  # and cleared if it was booked just before
        elif (session, job) in self._opened:
            self._opened[(session, job)] = ""
