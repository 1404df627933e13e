"""The SPU link communicator: libspu's messages between SPU members, on sockets of their own.

libspu talks through channels we implement in Python (``create_with_channels``) instead of
its brpc transport: a brpc peer that dies makes yacl ``exit()`` the surviving process after
its retries, and nothing releases a run blocked in a brpc receive. Here a receive waits in
:class:`SpuMailbox`, which an abort or the job's deadline wakes at once, so a failed member
never takes the others down or leaves them blocked.

Wire format on the SPU socket (raw frames, no codec: these are many small messages)::

    [b"MPLS", link id, source rank (ascii), libspu key, payload]

A link id is ``<session>/<job>/<op>``: every SPU op of every job has its own namespace.
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
from mpl.wire.errors import JobAbortedError, MplTimeoutError, WorkerLostError
from mpl.wire.sockets import configure, drain

__all__ = ["SPU_MAGIC", "SpuLinks", "SpuMailbox", "link_id"]

log = logging.getLogger("mpl.worker")
SPU_MAGIC = b"MPLS"
_ENDED_MEMORY = 4096


def link_id(session: str, job: str, op: int) -> str:
    return f"{session}/{job}/{op}"


def _job_of(link: str) -> tuple[str, str]:
    session, job, _ = link.split("/", 2)
    return session, job


class SpuMailbox:
    """libspu messages by (link, source, key), first in first out per key."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: dict[tuple[str, int, str], collections.deque[bytes]] = {}
        self._aborted: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()
        self._ended: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self.dropped = 0

    def put(self, link: str, src: int, key: str, data: bytes) -> None:
        job = _job_of(link)
        with self._cond:
            if job in self._ended or job in self._aborted:
                self.dropped += 1
                return
            self._items.setdefault((link, src, key), collections.deque()).append(data)
            self._cond.notify_all()

    def get(self, link: str, src: int, key: str, deadline: float) -> bytes:
        job = _job_of(link)
        slot = (link, src, key)
        with self._cond:
            while True:
                queue = self._items.get(slot)
                if queue:
                    data = queue.popleft()
                    if not queue:
                        del self._items[slot]
                    return data
                reason = self._aborted.get(job)
                if reason is not None:
                    raise JobAbortedError(f"job {job[1]} aborted: {reason}", job=job[1])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MplTimeoutError(
                        f"SPU message {key!r} from rank {src} did not arrive in time; "
                        "that member may be slow or dead"
                    )
                self._cond.wait(left)

    def abort(self, session: str, job: str, reason: str) -> None:
        with self._cond:
            self._aborted[(session, job)] = reason
            while len(self._aborted) > _ENDED_MEMORY:
                self._aborted.popitem(last=False)
            self._drop(session, job)
            self._cond.notify_all()

    def end(self, session: str, job: str) -> None:
        with self._cond:
            self._aborted.pop((session, job), None)
            self._ended[(session, job)] = None
            while len(self._ended) > _ENDED_MEMORY:
                self._ended.popitem(last=False)
            self._drop(session, job)

    def close_session(self, session: str, reason: str) -> None:
        with self._cond:
            for link, _, _ in list(self._items):
                s, job = _job_of(link)
                if s == session:
                    self._aborted[(s, job)] = reason
                    self._drop(s, job)
            self._cond.notify_all()

    def _drop(self, session: str, job: str) -> None:
        prefix = f"{session}/{job}/"
        for slot in [s for s in self._items if s[0].startswith(prefix)]:
            del self._items[slot]


class SpuLinks:
    """This worker's end of every SPU link: a PULL socket it binds, a PUSH per member."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        bind: str,
        rank: int,
        directory: Callable[[], dict[int, PeerInfo]],
    ) -> None:
        self.rank = rank
        self._ctx = ctx
        self._directory = directory
        self.pull = configure(ctx.socket(zmq.PULL))
        self.pull.bind(bind)
        self.address: str = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
        self.mailbox = SpuMailbox()
        self._push: dict[int, tuple[str, zmq.Socket[Any], threading.Lock]] = {}
        self._lock = threading.Lock()
        self.protocol_errors = 0
        self.messages_in = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._receive, name=f"mpl-spu-{rank}", daemon=True)
        self._thread.start()

    def send(self, dst: int, link: str, key: str, data: bytes) -> None:
        _, sock, lock = self._socket(dst)
        frames = [SPU_MAGIC, link.encode(), str(self.rank).encode(), key.encode(), data]
        with lock:
            sock.send_multipart(frames, copy=len(data) < 65536)

    def recv(self, link: str, src: int, key: str, deadline: float) -> bytes:
        return self.mailbox.get(link, src, key, deadline)

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
                sock.connect(peer.spu_addr)
                entry = self._push[dst] = (peer.spu_addr, sock, threading.Lock())
            return entry

    def _receive(self) -> None:
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                if not poller.poll(100):
                    continue
                for frames in drain(self.pull):
                    self._deliver(frames)
        finally:
            self.pull.close()

    def _deliver(self, frames: list[zmq.Frame]) -> None:
        try:
            magic, link, src, key, data = frames
            if magic.bytes != SPU_MAGIC:
                raise ValueError("bad magic")
            self.mailbox.put(link.bytes.decode(), int(src.bytes), key.bytes.decode(), data.bytes)
            self.messages_in += 1
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
