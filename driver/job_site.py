"""One call site's synchronous job, compiled: what it sends packed once, and the round trip
written out in one function instead of the client's generic layers.

A ``@mp.function`` program (or an eager plan) runs the same graph in the same session, on
the same ranks, with the same inline outputs and time limit, on every call: only the job id
and the bindings change. A :class:`JobSite` packs the rest of the ``Exec`` header once
(:func:`mpl.wire.exec_pack.exec_parts`, byte for byte what ``encode`` writes) and runs each
job as: draw an id, join the header, send it on the calling thread's socket, take the first
answer within the wait's first slice, read it (:func:`mpl.wire.result_read.answer_fields`,
with every check of the general path), book the job. No ``Exec`` record is built and no
generic wait loop, callback or key is set up for the answer that nearly always comes first.

In secure mode the job takes the same path: each rank's bindings are sealed
(``DriverSeal.sealed``), and the same header parts, bindings empty, go out with each rank's
compact box after them (``mpl.wire.sealed_exec``: the broker forwards each rank the header
and its box, with no header cut per rank); the answer's values are opened (by the session's
opener, ``mpl.wire.result_open``) before they are booked. A job with a large input among its
boxes (a ``Sealed`` record) is encoded in the codec's shape instead. A job a worker refused
as sealed for no process of its node (one that joined after the session opened) runs once
more, sealed for it (``DriverSeal.refused``). Whatever leaves that path goes on through the
general calls, which behave as they always did: bindings the packer does not take, a program the
broker does not hold yet, a broker the watch has a verdict on, and an answer that is not
this job's or comes later than the first slice (then ``BrokerCalls._wait`` takes over,
with the same deadline). Safe to share between threads: each uses its own
socket, and the packed parts are replaced whole.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import zmq

from mpl.driver.client import _REPORT_GRACE_S, _JobIds
from mpl.driver.context import _DELETE_BATCH, _DELETE_EVERY_S, job_stats
from mpl.driver.job_future import INTERRUPTED
from mpl.driver.job_progress import _REMEMBERED
from mpl.wire.codec import MAGIC_FRAME, SLICE_BELOW, from_wire, to_wire
from mpl.wire.errors import MplError, MplTimeoutError
from mpl.wire.exec_pack import exec_frames, exec_parts, pack_bindings
from mpl.wire.graph import Graph
from mpl.wire.jobs import Cancel, Exec, JobResult
from mpl.wire.record import pinned_fields
from mpl.wire.remote import from_info
from mpl.wire.result_read import RESULT_HEAD, answer_fields, result_fields
from mpl.wire.sealed_exec import BIN8_HEADS, SEALED_EXEC_MAGIC
from mpl.wire.sockets import send_frames

if TYPE_CHECKING:
    from mpl.driver.client import Client
    from mpl.driver.context import Context
    from mpl.driver.sealing import DriverSeal

__all__ = ["JobSite"]

_ID_MARK = bytes([0xA0 | 2 * _JobIds._BYTES])  # msgpack's fixstr marker of a job id's length
_ANSWER_HEAD = RESULT_HEAD + _ID_MARK  # a JobResult's header up to its job id's characters
_EMPTY_MAP = b"\x80"  # msgpack's empty map: the bindings of a job without inputs
_BYTES = {bytes}  # the types of a job's boxes when each is compact
_SMALL = 64 * 1024  # headers below pyzmq's copy threshold are sent here (copied by libzmq)
_MORE = int(zmq.SNDMORE)
_send = zmq.backend.Socket.send  # the compiled methods: pyzmq's Python layer costs more
_recv = zmq.backend.Socket.recv
_get = zmq.backend.Socket.get
_RCVMORE = int(zmq.RCVMORE)
# the sealed path fills its Execs in directly, naming every field (keywords), and _fields
# lists a JobResult's fields by hand: pinned here
_EXEC_FIELDS = pinned_fields(
    Exec,
    ("session", "job", "digest", "ranks", "bindings", "inline", "timeout_s"),
    "mpl.driver.job_site",
    direct=True,
)
_RESULT_FIELDS = pinned_fields(
    JobResult,
    ("job", "values", "error", "missing_program", "stats", "metas"),
    "mpl.driver.job_site",
    direct=True,
)
_now = time.monotonic
_wall = time.time


def _within_limit(client: Client, wire: list[Any], job: str) -> None:
    """Raise ``MessageTooLargeError`` if a frame of ``wire`` (the Exec of ``job``, as sent)
    is over the broker's limit: its socket would drop it with the connection."""
    oversized = client._oversized(wire, f"the Exec of job {job}")
    if oversized is not None:
        raise oversized


def _fields(answer: Any) -> list[Any] | None:
    """A JobResult record's fields as ``result_fields`` lists them; None for None."""
    if answer is None:
        return None
    return [
        JobResult.TAG,
        answer.job,
        answer.values,
        answer.error,
        answer.missing_program,
        answer.stats,
        answer.metas,
    ]


class JobSite:
    """The synchronous jobs of one graph in one context, with one set of inline outputs."""

    __slots__ = ("_around", "_parts", "_ranks", "ctx", "graph", "inline")

    def __init__(self, ctx: Context, graph: Graph, inline: tuple[int, ...]) -> None:
        self.ctx = ctx
        self.graph = graph
        self.inline = inline
        self._ranks = frozenset(graph.ranks)
        # the client's job_timeout, and for it (head with the id's marker, middle, tail) or
        # None when the general encoder must pack these fields
        self._parts: tuple[float, tuple[bytes, bytes, bytes] | None] | None = None
        # secure mode: the client's job_timeout, and for it what a sealed Exec's context
        # holds before and after the job id (DriverSeal.exec_around)
        self._around: tuple[float, str, str] | None = None

    def run(self, bindings: dict[int, list[Any]]) -> tuple[str, Any, dict[int, str]]:
        """Run the graph as one job with ``bindings`` and wait: the job's id, and its
        JobResult's ``values`` and ``metas`` (``ctx.run``'s result, its record not built).

        A job a worker refused as sealed for no process of its node (it joined after the
        session opened) runs once more as a new job, the general way, sealed for the process
        the refusal names (``DriverSeal.refused``); after a restart, the refusal is the
        job's error."""
        ctx = self.ctx
        client = ctx.client
        graph = self.graph
        seal = client.seal
        limit = client.job_timeout
        prepared = self._parts
        if prepared is None or prepared[0] != limit:
            prepared = self._prepare(limit)
        parts = prepared[1]
        if seal is None:
            packed: Any = _EMPTY_MAP if not bindings else pack_bindings(bindings)
            if packed is None or parts is None:
                return self._general(bindings)
        if (
            ctx.closed
            or graph.digest not in client._programs
            or (bindings and not bindings.keys() <= self._ranks)  # ranks beyond the graph's
        ):
            return self._general(bindings)
        holder = getattr(client._local, "socket", None)
        if holder is None or client._closed:  # (a closing client closes every socket)
            return self._general(bindings)  # which opens the socket
        sock = holder.sock
        compiled = isinstance(sock, zmq.backend.Socket)
        if not compiled:  # a look-alike (a test's): the usual way
            return self._general(bindings)
        wall, start = _wall(), _now()
        released = ctx._released
        if released and (len(released) >= _DELETE_BATCH or start - ctx._flushed > _DELETE_EVERY_S):
            ctx.flush()
        ids = client._job_ids
        job = next(ids.pool, None) or ids.refill()  # unguessable: see _JobIds
        job_bytes = job.encode()
        boxes: dict[int, Any] | None = None  # the sealed bindings (secure mode)
        try:  # blocks at most SNDTIMEO, as _job_call's send
            if seal is None:  # plain bindings, packed into the header
                assert parts is not None  # (checked above)
                head, middle, tail = parts
                # one frame (wire v4): the magic, then the header
                one = b"".join((MAGIC_FRAME, head, _ID_MARK, job_bytes, middle, packed, tail))
                size = len(one)
                if size < _SMALL and size <= client.max_message:
                    _send(sock, one, 0)
                else:  # a long header: within the broker's limit? (its socket drops more)
                    _within_limit(client, [one], job)
                    send_frames(sock, [one], 0)
            else:
                bin8 = BIN8_HEADS
                if bindings or seal.words:  # each rank's sealed for it (or with a word)
                    boxes = seal.sealed(
                        ctx.session, job, graph.digest, graph.ranks, self.inline, limit, bindings
                    )
                    compact = {*map(type, boxes.values())} == _BYTES
                else:  # a sealed None per rank (most jobs), its context written out here
                    around = self._around
                    if around is None or around[0] != limit:
                        around = self._around_for(seal, limit)
                    boxes = seal.nones(f"{around[1]}{job}{around[2]}".encode(), graph.ranks)
                    compact = seal.compact  # every sealed None a compact box, or none
                if parts is not None and compact:
                    # one header, its bindings empty, then each rank's compact box as a bin,
                    # in the order of graph.ranks (as sealed) (mpl.wire.sealed_exec): the
                    # broker forwards each rank the header and its box, nothing cut or packed
                    head, middle, tail = parts
                    # (one frame, wire v4: the magic first)
                    packed = [
                        SEALED_EXEC_MAGIC,
                        head,
                        _ID_MARK,
                        job_bytes,
                        middle,
                        _EMPTY_MAP,
                        tail,
                    ]
                    for box in boxes.values():  # a plain loop: a comprehension is a call
                        n = len(box)
                        packed += (bin8[n] if n < 256 else b"\xc5" + n.to_bytes(2, "big"), box)
                    one = b"".join(packed)
                    if len(one) > client.max_message:  # (boxes of many ranks, a small limit)
                        _within_limit(client, [one], job)
                    _send(sock, one, 0)
                else:  # a sealed record among them (large inputs): the codec's shape
                    msg = object.__new__(Exec)
                    msg.__dict__.update(
                        session=ctx.session,
                        job=job,
                        digest=graph.digest,
                        ranks=graph.ranks,
                        bindings=boxes,
                        inline=self.inline,
                        timeout_s=limit,
                    )
                    wire = to_wire(exec_frames(msg))
                    _within_limit(client, wire, job)
                    send_frames(sock, wire, 0)
        except zmq.Again:
            raise MplTimeoutError(
                f"job {job}: the broker at {client.address} took no message for "
                f"{client.timeout:g} s (the queue to it is full)"
            ) from None
        except zmq.ZMQError:
            if client._closed:  # closed by another thread meanwhile: its socket too
                raise MplError("the client is closed") from None
            raise
        progress = client.progress
        started = progress._started  # ProgressBoard.begin, with the clock read above
        started[job] = start
        if len(started) > _REMEMBERED:
            progress._forget_oldest()
        try:  # Ctrl-C in the wait: the job is cancelled, as Client.submit does
            fields: list[Any] | None = None  # the JobResult's, as wire.result_read lists them
            watch = client.watch
            if watch.refused is None and watch.silence is None and not watch.lost:
                try:  # the first slice: a trivial job's answer is here well before it ends
                    # its first frame copied (no Frame built: about 4.7k instructions); whether
                    # more follow is asked (as costly) only when it is not read alone below
                    answer = _recv(sock, 0, True)
                except zmq.Again:
                    answer = None
                if answer is not None:
                    head = _ANSWER_HEAD + job_bytes
                    read: list[Any] | None = None  # this job's result's fields, read here
                    if len(answer) < SLICE_BELOW:  # one frame (wire v4), read by msgpack alone
                        read = answer_fields(answer, head, safe=client.safe, alone=True)
                    if read is None:  # else the whole message, as received, read in full
                        wired: list[Any] = [answer]
                        while _get(sock, _RCVMORE):
                            wired.append(_recv(sock, 0, False))
                        frames = from_wire(wired)
                        read = result_fields(frames, head, safe=client.safe)
                        if read is None:  # a report, a late answer, a batch: as the wait reads
                            fields = _fields(client._mine(frames, job))
                    if read is not None:
                        fields = read
                        if not read[4]:  # not missing_program: ProgressBoard.end, written out
                            started.pop(job, None)
                            if progress._jobs or progress._watchers or progress._bars:
                                progress.end(job, read[3] is None)
            if fields is None:
                fields = _fields(self._wait(job, start + limit + _REPORT_GRACE_S, limit))
                assert fields is not None
        except KeyboardInterrupt:  # the job's other ranks stop waiting too (R33-3)
            progress.end(job, False)
            client._send(Cancel(ctx.session, job, INTERRUPTED))
            raise
        _, _, values, error, missing, stats, metas = fields
        if missing:  # a broker that lost the program: sent again, with a new job
            started.pop(job, None)
            client._programs.discard(graph.digest)
            return self._general(bindings)
        if error is not None:
            # a worker that forgot our stream: a new one, and the job again if sealed for none
            if seal is not None and seal.refused(error, boxes):
                return self._general(bindings, again=False)
            raise from_info(error)
        if seal is not None:  # opened from the fields: no JobResult built for it
            session = ctx.session  # DriverSeal.opened, written out: one Python call
            values = (seal.openers.get(session) or seal.opener(session))(job, values)
        ranks = self._ranks
        for rank in stats:  # a loop, no call: the honest answer names only the job's ranks
            if rank not in ranks:  # a broker naming others: kept only for the job's
                stats = job_stats(stats, ranks)
                break
        ctx._job_rows.append((job, graph.name, wall, _now() - start, stats))
        return job, values, metas

    def _general(
        self, bindings: dict[int, list[Any]], again: bool = True
    ) -> tuple[str, Any, dict[int, str]]:
        """The job the general way (``ctx.run``), for what leaves the compiled path."""
        result = self.ctx.run(self.graph, bindings, inline=self.inline, again=again)
        return result.job, result.values, result.metas

    def _wait(self, job: str, deadline: float, limit: float) -> JobResult:
        """The rest of the wait, the general way (``Client.submit``'s, from its first slice)."""
        ctx = self.ctx
        client = ctx.client
        sock = client._socket()
        session = ctx.session
        left = deadline - _now()
        try:
            answer = client._wait(
                sock, session, f"job {job}", deadline, limit, left, client._mine, job, job
            )
        except MplTimeoutError:
            client.progress.end(job, False)
            client._send(Cancel(session, job, f"the driver stopped waiting after {limit:g} s"))
            raise
        assert type(answer) is JobResult
        return answer

    def _around_for(self, seal: DriverSeal, limit: float) -> tuple[float, str, str]:
        graph = self.graph
        before, after = seal.exec_around(
            self.ctx.session, graph.digest, graph.ranks, self.inline, limit
        )
        around = self._around = (limit, before, after)
        return around

    def _prepare(self, limit: float) -> tuple[float, tuple[bytes, bytes, bytes] | None]:
        graph = self.graph
        parts = exec_parts(self.ctx.session, graph.digest, graph.ranks, self.inline, limit)
        prepared = self._parts = (limit, parts)
        return prepared
