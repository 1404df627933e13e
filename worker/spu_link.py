"""The SPU link communicator: libspu's messages between SPU members, on sockets of their own.

libspu talks through channels we implement in Python (``create_with_channels``) instead of
its brpc transport: a brpc peer that dies makes yacl ``exit()`` the surviving process after
its retries, and nothing releases a run blocked in a brpc receive. Here a receive waits in
:class:`SpuMailbox`, which an abort of the job being run, or the job's deadline, wakes at
once, so a failed member never takes the others down or leaves them blocked.

A *lane* is one libspu link (and Runtime) that the members of an SPU device keep for a
session and reuse job after job; its id is ``<session>/<device>/<members' incarnations>/<n>``
and every member computes the same one. Wire format on the SPU socket (raw frames, no codec:
these are many small messages)::

    [b"MPLS", lane id, source rank (ascii), libspu key, payload]
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from mpl.wire.control import PeerInfo
from mpl.wire.curve import PEER_DOMAIN, Curve
from mpl.wire.errors import JobAbortedError, MplTimeoutError, WorkerLostError
from mpl.wire.limits import MAX_SPU_PENDING, MAX_SPU_PENDING_BYTES
from mpl.wire.lru import LRU
from mpl.wire.sockets import MAX_MESSAGE, configure, drain
from mpl.worker.holding import Holding

__all__ = ["SPU_MAGIC", "SpuLinks", "SpuMailbox"]

log = logging.getLogger("mpl.worker")
SPU_MAGIC = b"MPLS"
_MEMORY = 4096  # dead lanes and aborted jobs remembered
_PUMP_S = 0.05  # a waiting receive reads the socket this long before checking aborts again
_SEND_RETRY_S = 0.005  # a send to a full queue retries this often, checking aborts each time


class SpuMailbox:
    """libspu messages by (lane, source, key), first in first out per key.

    Messages are accepted for the lanes this worker opened (:meth:`open_lane`); those for
    any other lane wait in a bounded holding area until it opens (a peer may open a lane
    first), and are dropped, counted, when it is full or they are a few seconds old.
    Messages waiting for their receive are bounded too, in entries and in bytes
    (MAX_SPU_PENDING, MAX_SPU_PENDING_BYTES): beyond either, a new one is dropped and
    counted in ``overflow`` (the run that needed it then fails at its deadline).
    """

    def __init__(
        self,
        holding: Holding | None = None,
        *,
        max_entries: int = MAX_SPU_PENDING,
        max_bytes: int = MAX_SPU_PENDING_BYTES,
    ) -> None:
        self._cond = threading.Condition()
        self._items: dict[tuple[str, int, str], collections.deque[bytes]] = {}
        self._aborted: LRU[tuple[str, str], str] = LRU(_MEMORY)
        self._dead: LRU[str, bool] = LRU(_MEMORY)
        self._open: LRU[str, bool] = LRU(_MEMORY)
        self._held = holding or Holding()
        self._arrivals = 0  # tells apart held messages that share a key
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries = 0  # messages in _items, and their bytes
        self._bytes = 0
        self.dropped = 0  # for lanes already dropped
        self.overflow = 0  # refused: the mailbox was full

    def pending(self) -> tuple[int, int]:
        """Messages waiting for their receive, and their bytes."""
        with self._cond:
            return self._entries, self._bytes

    def _add(self, slot: tuple[str, int, str], data: bytes) -> bool:
        if self._entries >= self._max_entries or self._bytes + len(data) > self._max_bytes:
            self.overflow += 1
            return False
        self._items.setdefault(slot, collections.deque()).append(data)
        self._entries += 1
        self._bytes += len(data)
        return True

    def _discard(self, slots: list[tuple[str, int, str]]) -> None:
        for slot in slots:
            queue = self._items.pop(slot)
            self._entries -= len(queue)
            self._bytes -= sum(len(d) for d in queue)

    @property
    def held_dropped(self) -> int:
        return self._held.dropped

    def open_lane(self, lane: str) -> None:
        """This worker uses ``lane``: accept its messages, including those held."""
        with self._cond:
            self._open_lane(lane)

    def _open_lane(self, lane: str) -> None:
        if lane in self._open or lane in self._dead:
            return
        self._open[lane] = True
        for held, data in self._held.release(lane):
            slot: tuple[str, int, str] = (lane, *held[:2])  # type: ignore[index]
            self._add(slot, data)
        self._cond.notify_all()

    def put(self, lane: str, src: int, key: str, data: bytes) -> None:
        with self._cond:
            if lane in self._dead:
                self.dropped += 1
                return
            if lane not in self._open:
                self._arrivals += 1
                self._held.hold(lane, (src, key, self._arrivals), data)
                return
            if self._add((lane, src, key), data):
                self._cond.notify_all()

    def get(
        self,
        lane: str,
        src: int,
        key: str,
        job: tuple[str, str],
        deadline: float,
        pump: Callable[[float], bool] | None = None,
    ) -> bytes:
        """The next message ``key`` from ``src`` on ``lane``, for ``job`` (session, job id).

        ``pump(seconds)`` reads the socket for a while if nobody else is reading it; the
        waiting thread then takes its message straight off the socket instead of being
        woken by the receiving thread (one thread switch less per message).
        """
        slot = (lane, src, key)
        with self._cond:
            self._open_lane(lane)  # the local runtime receives on it: the lane is real
        while True:
            with self._cond:
                queue = self._items.get(slot)
                if queue:
                    data = queue.popleft()
                    self._entries -= 1
                    self._bytes -= len(data)
                    if not queue:
                        del self._items[slot]
                    return data
                reason = self._aborted.get(job)
                if reason is not None:
                    raise JobAbortedError(f"job {job[1]} aborted: {reason}", job=job[1])
                if lane in self._dead:
                    raise JobAbortedError(f"SPU lane {lane} was dropped", job=job[1])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MplTimeoutError(
                        f"SPU message {key!r} from rank {src} did not arrive in time; "
                        "that member may be slow or dead"
                    )
                if pump is None:
                    self._cond.wait(left)
                    continue
            if not pump(min(left, _PUMP_S)):  # another receive reads the socket: let it
                with self._cond:
                    if slot not in self._items:
                        self._cond.wait(0.002)

    def stopped(self, lane: str, job: tuple[str, str]) -> str | None:
        """Why ``job`` on ``lane`` must stop waiting (aborted, or the lane dropped), or None."""
        with self._cond:
            reason = self._aborted.get(job)
            if reason is not None:
                return f"job {job[1]} aborted: {reason}"
            if lane in self._dead:
                return f"SPU lane {lane} was dropped"
            return None

    def abort(self, session: str, job: str, reason: str) -> None:
        """Wake whatever ``job`` waits on with JobAbortedError."""
        with self._cond:
            self._aborted[(session, job)] = reason
            self._cond.notify_all()

    def end(self, session: str, job: str) -> None:
        with self._cond:
            self._aborted.pop((session, job), None)

    def drop_lane(self, lane: str) -> None:
        """Forget a lane: its waiting receives fail, its late messages are dropped."""
        with self._cond:
            self._dead[lane] = True
            self._open.pop(lane, None)
            self._held.release(lane)
            self._discard([s for s in self._items if s[0] == lane])
            self._cond.notify_all()

    def close_session(self, session: str, reason: str) -> None:
        with self._cond:
            self._held.forget(lambda lane: str(lane).startswith(f"{session}/"))
            for lane in {s[0] for s in self._items if s[0].startswith(f"{session}/")}:
                self._dead[lane] = True
            self._discard([s for s in self._items if s[0].startswith(f"{session}/")])
            self._cond.notify_all()


class SpuLinks:
    """This worker's end of every SPU link: a PULL socket it binds, a PUSH per member.

    In secure mode the PULL admits only the spec's nodes, each PUSH pins its member's key
    from this worker's own spec, and a message whose source rank is not the rank its
    connection authenticated as is counted and dropped.
    """

    def __init__(
        self,
        ctx: zmq.Context[Any],
        bind: str,
        rank: int,
        directory: Callable[[], dict[int, PeerInfo]],
        *,
        curve: Curve | None = None,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        self.rank = rank
        self._ctx = ctx
        self._directory = directory
        self._curve = curve
        self.pull = configure(ctx.socket(zmq.PULL), max_message=max_message)
        if curve is not None:
            curve.serve(self.pull, PEER_DOMAIN)
        self.pull.bind(bind)
        self.address: str = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
        self.mailbox = SpuMailbox()
        self._push: dict[int, tuple[str, zmq.Socket[Any], threading.Lock]] = {}
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # whoever holds it reads the PULL socket
        self._waiting = 0  # receives in progress: the background thread leaves the socket alone
        self.protocol_errors = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._receive, name=f"mpl-spu-{rank}", daemon=True)
        self._thread.start()

    def send(
        self, dst: int, lane: str, key: str, data: bytes, job: tuple[str, str], deadline: float
    ) -> None:
        """Queue one libspu message to ``dst`` without ever blocking past ``job``'s end.

        A member that died (or stopped reading) fills its queue; then the send waits, but
        raises JobAbortedError as soon as ``job`` is aborted or ``lane`` dropped, and
        MplTimeoutError at ``deadline``: the runtime that called it fails instead of hanging.
        """
        _, sock, lock = self._socket(dst)
        frames = [SPU_MAGIC, lane.encode(), str(self.rank).encode(), key.encode(), data]
        copy = len(data) < 65536
        while True:
            if lock.acquire(timeout=_SEND_RETRY_S):  # another send to dst may be stuck too
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
                    return
                except zmq.Again:
                    pass  # the member's queue is full
                finally:
                    lock.release()
            reason = self.mailbox.stopped(lane, job)
            if reason is not None:
                raise JobAbortedError(reason, job=job[1])
            if time.monotonic() > deadline:
                raise MplTimeoutError(
                    f"rank {dst} did not take SPU message {key!r} in time (its queue is "
                    "full); that member may be slow or dead"
                )
            time.sleep(_SEND_RETRY_S)

    def recv(self, lane: str, src: int, key: str, job: tuple[str, str], deadline: float) -> bytes:
        with self._lock:
            self._waiting += 1
        try:
            return self.mailbox.get(lane, src, key, job, deadline, self._pump)
        finally:
            with self._lock:
                self._waiting -= 1

    def _pump(self, seconds: float) -> bool:
        """Read the socket for up to ``seconds`` unless another thread is: False then."""
        if not self._reading.acquire(blocking=False):
            return False
        try:
            if self.pull.poll(int(seconds * 1000) + 1):
                for frames in drain(self.pull):
                    self._deliver(frames)
        finally:
            self._reading.release()
        return True

    def _socket(self, dst: int) -> tuple[str, zmq.Socket[Any], threading.Lock]:
        peer = self._directory().get(dst)
        if peer is None or not peer.spu_addr:
            raise WorkerLostError(f"rank {dst} has no SPU link address in the directory", rank=dst)
        with self._lock:
            entry = self._push.get(dst)
            if entry is None or entry[0] != peer.spu_addr:
                if entry is not None:
                    with entry[2]:
                        entry[1].close(linger=0)
                sock = configure(self._ctx.socket(zmq.PUSH))
                if self._curve is not None:
                    self._curve.dial(sock, self._curve.node_key(dst))
                sock.connect(peer.spu_addr)
                entry = self._push[dst] = (peer.spu_addr, sock, threading.Lock())
            return entry

    def _receive(self) -> None:
        """Keep the socket drained while no receive is waiting (waiting ones read it)."""
        try:
            while not self._stopping.is_set():
                if self._waiting or not self._reading.acquire(blocking=False):
                    time.sleep(0.005)
                    continue
                try:
                    if self.pull.poll(10):
                        for frames in drain(self.pull):
                            self._deliver(frames)
                finally:
                    self._reading.release()
        finally:
            with self._reading:
                self.pull.close()

    def _deliver(self, frames: list[zmq.Frame]) -> None:
        try:
            magic, lane, src, key, data = frames
            if magic.bytes != SPU_MAGIC:
                raise ValueError("bad magic")
            source = int(src.bytes)
            if self._curve is not None and self._curve.sender_rank(magic) != source:
                self.protocol_errors += 1
                log.warning("rank %d: dropped an SPU message forging source %d", self.rank, source)
                return
            self.mailbox.put(lane.bytes.decode(), source, key.bytes.decode(), data.bytes)
        except (ValueError, UnicodeDecodeError):
            self.protocol_errors += 1
            log.warning("rank %d: dropped a malformed SPU link message", self.rank)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(2)
        with self._lock:
            for _, sock, lock in self._push.values():
                with lock:
                    sock.close()
            self._push.clear()
