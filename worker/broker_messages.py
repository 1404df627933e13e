"""How the worker reads and dispatches what the broker sends it (the I/O thread's part).

:class:`BrokerMessages` is the half of :class:`~mpl.worker.daemon.Worker` that takes one
ZeroMQ message from the broker's socket and acts on it: a program's next ``Exec`` read by
comparison with its last one (``mpl.wire.exec_repeat``, in secure mode too), a batch split
into its messages, anything else checked and decoded under the party's code policy; then
opened by the seal (secure mode), and handed to the job shell or run inline. Every message
is handled under one guard: a message's failure stays that message's failure. Sending,
the timers and the sockets are the daemon's (``daemon.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zmq import Frame

from mpl.wire.batch import is_batch, split_batch
from mpl.wire.codec import MAGIC_FRAME, decode
from mpl.wire.data import Fetch
from mpl.wire.errors import ProtocolError
from mpl.wire.exec_repeat import RepeatExecs, raw_bytes
from mpl.wire.guard import Guard
from mpl.wire.jobs import Abort, Exec, Failed
from mpl.wire.logs import RefusalLog
from mpl.wire.record import Record
from mpl.wire.safe_values import BROKER, pickles_allowed
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, is_sealed_exec, split_own
from mpl.wire.sessions import SessionClosed, SessionRuntime
from mpl.worker.code_policy import HoldsPickles, holds_pickle, refusal, screen, unloadable
from mpl.worker.jobs import Jobs
from mpl.worker.session_runtime import SessionRuntimes
from mpl.worker.state_events import Action, CodeRefused, FetchArrived, ProgramUnloadable
from mpl.worker.store import ABSENT, ObjectStore

if TYPE_CHECKING:  # secure mode's: not imported on a plain start
    from mpl.worker.sealing import WorkerSeal

__all__ = ["BrokerMessages"]

_new = object.__new__

log = logging.getLogger("mpl.worker")
# A fetched container of more items than this is answered by a job thread, not the I/O
# thread: encoding a Python list costs per item (5 million: seconds, past the broker's
# patience with a silent worker); an array or a byte string costs almost nothing.
QUICK_REPLY_ITEMS = 10_000
_CONTAINERS = (list, tuple, dict, set, frozenset)  # and their subclasses (isinstance)

# Dones gathered from one batch go out this many at a time: the broker and the driver work
# on the first ones while this thread runs the rest (one message of all 64 kept the three
# processes in lock-step: about 1 core busy of 2, where parts of 16 kept about 1.3 busy)
_DONES_AT_ONCE = 16


class BrokerMessages:
    """The worker's handling of the broker's messages (mixed into ``Worker``, which sets
    these attributes and provides the sending methods)."""

    rank: int
    trusted: bool
    code: str
    seal: WorkerSeal | None
    jobs: Jobs
    store: ObjectStore
    runtimes: SessionRuntimes
    guard: Guard
    refusals: RefusalLog
    protocol_errors: int
    _execs: RepeatExecs
    # the last sealed Exec read in full, and it with no bindings (_unbound)
    _bare: tuple[Exec | None, Exec] = (None, object.__new__(Exec))
    _gathered: list[list[Any]] | None
    _send: Callable[[Record], None]
    _send_gathered: Callable[[], None]
    _perform: Callable[[list[Action]], None]
    _post_done_frame: Callable[[bytes], None]

    def _on_frames(self, frames: list[Any]) -> None:
        """Handle one ZeroMQ message from the broker: a message, or a batch of them (each
        handled as if it had arrived alone; the Dones of jobs run inline meanwhile go back
        as one batch).

        A program's next ``Exec`` (most messages of a busy worker) is recognised first, by
        comparison with the last one read, and goes straight to its handling: in
        plaintext by its job id alone (``RepeatExecs.repeat_job``, or ``repeat_frame`` in
        the I/O thread's turn for a message of one frame, before this; the job shell runs it
        as the last ``Exec`` with that id, and a record of it is made only if it must be
        handed on), in secure mode by its job id and sealed box (``repeat_box``), which the
        seal opens or refuses (``WorkerSeal.open_exec``) before a job without inputs runs
        the same way (``--code kernels``: as a record through ``_on_broker``). Every
        message is handled under one guard: a message's failure stays that message's
        failure."""
        execs = self._execs
        repeat: Exec | None = None
        if self.seal is None:
            job = execs.repeat_job(frames)
            if job is not None:
                self._on_repeat(job)
                return
        elif self.code == "any":  # a sealed repeat: opened and run by its job id, no record
            magic = frames[0]
            if (
                len(frames) == 2
                and (magic.bytes if type(magic) is Frame else magic) == SEALED_EXEC_MAGIC
            ):  # its box after its plain header, in one frame (mpl.wire.sealed_exec)
                data = frames[1]
                got = execs.repeat_sealed(data.bytes if type(data) is Frame else bytes(data))
                if got is None:  # no repeat: read in full, or refused (counted)
                    self._on_sealed_exec(frames)
                    return
                job, box = got
                read: tuple[str, int, bytes] | None = (job, self.rank, box)
            elif is_sealed_exec(frames):  # refused (counted)
                self._on_sealed_exec(frames)
                return
            else:  # the codec's shape: the box inside the header (large inputs)
                read = execs.repeat_box(frames)
            if read is not None and execs.last is not None:  # (kept with it)
                self._on_sealed_repeat(*read)
                return
        elif is_sealed_exec(frames):  # its box after its header (mpl.wire.sealed_exec)
            self._on_sealed_exec(frames)
            return
        else:
            repeat = execs.repeat(frames)
        msg: Record | None = repeat
        if msg is None:
            if is_batch(frames):
                self._on_batch(frames)
                return
            msg = self._read(frames)
            if msg is None:  # refused, or handled as refused
                return
        try:
            self._on_broker(msg)
        except Exception as exc:
            reply = self.guard.internal("the broker", msg, exc, rank=self.rank)
            if reply is not None:
                self._send(reply)

    def _on_repeat(self, job: str) -> None:
        """A plaintext program's next ``Exec``, said by its job id alone (the last one read
        but for that id: ``RepeatExecs.repeat_job`` or ``repeat_frame``): run inline, or
        handed on as a record of it. Its failure stays its own (guarded)."""
        execs = self._execs
        try:  # _on_exec, written out for a job id (a call and a record less)
            if self.runtimes.refused_sessions:
                self._on_exec(execs.record(job))
            elif not self.jobs.run_now(execs.last, job):  # type: ignore[arg-type]
                record = execs.record(job)
                self._send_gathered()  # Dones gathered go before a job thread's
                self._perform(self.jobs.handle(record))
        except Exception as exc:
            self._repeat_failed(job, exc)

    def _repeat_failed(self, job: str, exc: Exception) -> None:
        """The guard's answer to a plaintext repeat's failure (:meth:`_on_repeat`'s, or the
        I/O thread's own run of one: ``Worker._turn``)."""
        record = self._execs.record(job)
        reply = self.guard.internal("the broker", record, exc, rank=self.rank)
        if reply is not None:
            self._send(reply)

    def _on_sealed_repeat(self, job: str, rank: int, box: bytes) -> None:
        """A program's next sealed ``Exec``, said by its job id and the box keyed for
        ``rank`` (the last one read but for those: ``RepeatExecs.repeat_sealed_frame``,
        ``repeat_sealed`` or ``repeat_box``): opened by the seal (``WorkerSeal.open_exec``)
        or refused, then run inline or handed on as a record of it. Its failure stays its
        own (guarded)."""
        last: Exec = self._execs.last  # type: ignore[assignment]  # (said with it)
        try:  # _on_broker and _on_exec, written out (two calls and a record less)
            # inbound's bindings.get(rank): a box keyed for another rank is none
            mine = self.seal.open_exec(last, job, box if rank == self.rank else None)  # type: ignore[union-attr]
            if type(mine) is Failed:
                self._send(mine)
                self.protocol_errors += 1
                log.warning("rank %d: refused a %s that did not authenticate", self.rank, Exec.TAG)
            elif mine is not None or self.runtimes.refused_sessions:
                self._on_exec(_with_job(last, job, {} if mine is None else {rank: mine}))
            elif (  # run_now, without its call: _unbound(last), its common case written out
                done := self.jobs.run_repeat(
                    bare[1] if (bare := self._bare)[0] is last else self._unbound(last), job
                )
            ) is None:
                self._send_gathered()  # Dones gathered go before a job thread's
                self._perform(self.jobs.handle(_with_job(last, job, {})))
            elif done:  # its Done's frame, its value sealed (WorkerSeal.sealed_scalars)
                self._post_done_frame(done)
        except Exception as exc:
            record = _with_job(last, job, {})
            reply = self.guard.internal("the broker", record, exc, rank=self.rank)
            if reply is not None:
                self._send(reply)

    def _on_sealed_exec(self, frames: list[Any]) -> None:
        """A sealed Exec whose box follows its header (``mpl.wire.sealed_exec``) that is no
        repeat of the last one: the magic, then one frame holding a header read as a
        plaintext Exec's (bindings empty) and exactly one box; anything else is refused and
        counted. The box is opened (``WorkerSeal.open_exec``) before anything runs: one
        sealed for another rank, job or header does not open here."""
        execs, seal = self._execs, self.seal
        assert seal is not None
        try:
            if len(frames) != 2:
                raise ProtocolError(f"a sealed Exec of {len(frames)} frames, not 2")
            header, box = split_own(raw_bytes(frames[1]))
            read = execs.read_in_full([MAGIC_FRAME, header])
            # the record the box is opened against: the one kept to compare the next ones
            # with (read_in_full's, the same fields), or what decode read of this header
            last = execs.last if read is not None else None
            if read is None:  # decode accepts it or says why not
                decoded = decode([MAGIC_FRAME, header], safe=True, unpickle=False)
                if type(decoded) is not Exec:
                    raise ProtocolError(f"a sealed Exec's header holds a {decoded.TAG!r}")
                read = decoded
            if read.bindings:
                raise ProtocolError("a sealed Exec's header carries bindings")
            job = read.job
            last = last or read
        except ProtocolError as exc:
            self.protocol_errors += 1
            self.refusals.refused("the broker", f"dropped a bad message: {exc}")
            return
        rank = self.rank
        try:
            if self.code != "any":  # the seal opens it in _on_broker, under the code policy
                self._on_broker(_with_job(last, job, {rank: box}))
                return
            mine = seal.open_exec(last, job, box)  # _on_broker and _on_exec, written out
            if type(mine) is Failed:
                self._send(mine)
                self.protocol_errors += 1
                log.warning("rank %d: refused a %s that did not authenticate", rank, Exec.TAG)
            elif mine is not None or self.runtimes.refused_sessions:
                self._on_exec(_with_job(last, job, {} if mine is None else {rank: mine}))
            elif not self.jobs.run_now(
                bare[1] if (bare := self._bare)[0] is last else self._unbound(last), job
            ):
                self._send_gathered()  # Dones gathered go before a job thread's
                self._perform(self.jobs.handle(_with_job(last, job, {})))
        except Exception as exc:
            reply = self.guard.internal("the broker", _with_job(last, job, {}), exc, rank=rank)
            if reply is not None:
                self._send(reply)

    def _unbound(self, last: Exec) -> Exec:
        """``last`` (a program's last sealed Exec read in full) with no bindings: what its
        repeats that opened to no inputs run as, by their job ids (kept while it is last)."""
        kept = self._bare
        if kept[0] is not last:
            kept = self._bare = (last, _with_job(last, last.job, {}))
        return kept[1]

    def _on_batch(self, frames: list[Any]) -> None:
        """A batch of the broker's messages, one at a time (none of them a batch:
        ``split_batch`` refuses that); the Dones of the jobs run inline go back gathered."""
        try:
            inner = split_batch(frames)
        except ProtocolError as exc:
            self.protocol_errors += 1
            self.refusals.refused("the broker", f"dropped a bad message: {exc}")
            return
        self._gathered = []
        execs = self._execs if self.seal is None else None
        try:
            for one in inner:
                # a plaintext program's next Exec (most): _on_frames' first step, written out
                job = execs.repeat_job(one) if execs is not None else None
                if job is not None:
                    self._on_repeat(job)
                else:
                    self._on_frames(one)
                if len(self._gathered) >= _DONES_AT_ONCE:
                    self._send_gathered()
        finally:
            self._send_gathered()
            self._gathered = None

    def _read(self, frames: list[Any]) -> Record | None:
        """Check and decode one message from the broker that is no repeat ``Exec``: the
        record, or None when it was refused (counted, or its job failed saying why)."""
        # In secure mode the broker is not trusted: what a driver sends is sealed (opened
        # by _on_broker, and only then unpickled), so a pickle in the clear from the broker
        # is refused. A plain Exec (most messages) holds no pickle and is read on a lean
        # path, exactly as decode would read it (mpl.wire.hot.read_exec, which the broker
        # uses for the driver's Exec too), and kept to compare the program's next Exec with
        # (mpl.wire.exec_repeat). Anything else is decoded under the party's code policy:
        # ``--code kernels`` refuses any pickle, unloaded (code_policy.screen).
        try:
            msg: Record | HoldsPickles | None = self._execs.read_in_full(frames)
            if msg is None:
                safe = not pickles_allowed(
                    BROKER, trusted=self.trusted, secure=self.seal is not None
                )
                msg = screen(frames, self.code, safe=safe)
        except ProtocolError as exc:
            if not self._undecodable(frames, exc):
                self.protocol_errors += 1
                self.refusals.refused("the broker", f"dropped a bad message: {exc}")
            return None
        if isinstance(msg, HoldsPickles):
            self._refuse_code(msg.opaque)
            return None
        return msg

    def _on_broker(self, msg: Record) -> None:
        if self.seal is not None:
            opened, answer = self.seal.inbound(msg)
            if answer is not None:
                self._send(answer)
            if opened is None:
                self.protocol_errors += 1
                log.warning("rank %d: refused a %s that did not authenticate", self.rank, msg.TAG)
                return
            msg = opened
            # the seal hid the program's or inputs' pickles from the check on the frames:
            # it opened them opaque, and they are refused here the same way
            if self.code != "any" and holds_pickle(msg):
                self._refuse_code(msg)
                return
        if type(msg) is Exec:  # most messages: first, past no other type's checks
            self._on_exec(msg)
            return
        if isinstance(msg, Abort) and self.seal is not None:
            self.seal.forget(msg.session, msg.job)
        if isinstance(msg, SessionRuntime):  # a session's runtime_info for this node
            if (ack := self.runtimes.open(msg)) is not None:
                self._send(ack)
            return
        if isinstance(msg, SessionClosed):
            self.runtimes.closed(msg.session)
        event: Any = msg
        if isinstance(msg, Fetch):  # a value already here (and quick to encode): at once
            held = self.store.held(msg.session, msg.uri)
            quick = not isinstance(held, _CONTAINERS) or _quick_to_encode(held)
            event = FetchArrived(msg, held is not ABSENT and quick)
        self._perform(self.jobs.handle(event))

    def _on_exec(self, msg: Exec) -> None:
        """A job (opened, if sealed): refused, run here whole, or handed to the state."""
        runtimes = self.runtimes
        if runtimes.refused_sessions and (refused := runtimes.failed(msg)) is not None:
            self._send(refused)  # a session whose runtime_info this node refused
        elif not self.jobs.run_now(msg):  # a repeat quick job runs here, whole
            # Dones gathered from this batch go before a job thread may answer
            self._send_gathered()
            self._perform(self.jobs.handle(msg))

    def _refuse_code(self, opaque: Record) -> None:
        """Refuse a message that holds pickles, none of them loaded: its program or job
        fails with the policy's reason, anything else is only counted."""
        event = refusal(opaque, self.rank)
        if event is None:
            self.protocol_errors += 1
            log.warning("rank %d: refused a %s holding pickles", self.rank, opaque.TAG)
            return
        if isinstance(event, CodeRefused):
            log.warning("rank %d: %s", self.rank, event.why)
        self._perform(self.jobs.handle(event))

    def _undecodable(self, frames: list[Any], exc: ProtocolError) -> bool:
        """A program or job whose values do not unpickle here: its jobs fail saying why."""
        try:
            event = unloadable(decode(frames, unpickle=False), self.rank, str(exc))
        except ProtocolError:
            return False
        if event is None:
            return False
        if isinstance(event, ProgramUnloadable):
            log.warning("rank %d: cannot load program %s: %s", self.rank, event.digest, exc)
        self._perform(self.jobs.handle(event))
        return True


def _with_job(msg: Exec, job: str, bindings: dict[int, Any]) -> Exec:
    """``msg`` with job id ``job`` and ``bindings``, built as decode builds it."""
    other: Exec = _new(Exec)
    fields = other.__dict__
    fields.update(msg.__dict__)
    fields["job"], fields["bindings"] = job, bindings
    return other


def _quick_to_encode(value: Any) -> bool:
    """Whether ``value`` holds at most ``QUICK_REPLY_ITEMS`` items in all, at any depth:
    a walk that stops once past them, so it costs at most that many steps. A long list
    inside a short dict or tuple costs its encoding (and ``check_safe``'s walk) as much as
    one at the top (review of w33-limits: ``{"xs": [5 million ints]}`` was encoded on the
    I/O thread)."""
    left = QUICK_REPLY_ITEMS
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            left -= 2 * len(item)
            if left < 0:
                return False
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, _CONTAINERS):
            left -= len(item)
            if left < 0:
                return False
            stack += item
    return True
