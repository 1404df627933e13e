"""What secure mode adds to the broker's own loop per job, counted (never timed).

A real ``Broker`` on 127.0.0.1 whose loop is turned by hand, fed by DEALER sockets standing
in for a driver and two workers, once in plaintext and once over CurveZMQ with each
party's key: the Python calls a trivial job costs at the broker, from the receive of its
Exec to the send of its answer. Besides CURVE itself (libzmq's), what secure mode adds is
reading each message's authenticated identity from its frame.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import msgpack
import zmq
from hand_turned_broker import HandTurnedBroker, turned_frames
from helpers import two_rank_keys

from mpl.broker.daemon import Broker
from mpl.wire.cluster import ClusterSpec
from mpl.wire.codec import encode, to_wire
from mpl.wire.curve import Curve
from mpl.wire.jobs import Done, Exec, JobResult
from mpl.wire.keys import load_keypair
from mpl.wire.run_stats import pack_stats
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC

_STATS = pack_stats(1.2e-05, 1.7645e9, [[0, "pcall", 1e-06, 1.1e-05]])
_BOX = b"mpl-box\x01" + bytes(range(60))  # what a worker's sealed value looks like here


class _Cluster(HandTurnedBroker):
    """A broker of two ranks and its three peers, in plaintext (``root`` None) or over
    CurveZMQ with keys made in ``root``; ``job`` runs one trivial job through it, the
    broker's turns for it counted by a sys.setprofile function."""

    def __init__(self, root: Path | None) -> None:
        spec = ClusterSpec.simple(2, enable_spu=False)
        curves: dict[str, Curve] = {}
        if root is not None:
            spec, secrets = two_rank_keys(root, spec)
            curves = {name: Curve(load_keypair(file), spec) for name, file in secrets.items()}
        self.secure = root is not None
        super().__init__(
            spec, "tcp://127.0.0.1:0", "secure-counts", ranks=(0, 1), curves=curves, turns=2000
        )

    def job(self, count: Any) -> None:
        self.jobs += 1
        name = f"j{self.jobs}"
        # in secure mode a worker's value is a sealed box: bytes the broker forwards
        value = _BOX if self.secure else 1
        self.driver.send_multipart(
            to_wire(encode(Exec(self.sid, name, self.graph.digest, (0, 1), {}, (0,))))
        )
        for rank, w in enumerate(self.workers):
            assert self._next(w, Exec, count).job == name
            w.send_multipart(
                to_wire(encode(Done(self.sid, name, rank, {0: value}, _STATS, {0: "b"})))
            )
        result = self._next(self.driver, JobResult, count)
        assert result.job == name and result.error is None
        assert result.values == {0: {0: value, 1: value}}

    def sealed_job(self, counted: Any) -> None:
        """A job whose Exec is in the sealed shape (``mpl.wire.sealed_exec``: one frame,
        its header then each rank's box, as ``driver/job_site.py`` sends it)."""
        self.jobs += 1
        name = f"j{self.jobs:023d}"  # as long each time: the driver's ids are
        exe = Exec(self.sid, name, self.graph.digest, (0, 1), {}, (0,))
        header = bytes(encode(exe)[1])
        boxes = [_BOX + bytes([rank, self.jobs % 256]) for rank in range(2)]
        frame = SEALED_EXEC_MAGIC + header + b"".join(map(msgpack.packb, boxes))
        self.driver.send_multipart([frame])
        for rank, w in enumerate(self.workers):
            got = _turned_raw(self.broker, w, counted)
            # each rank: the magic, the header as it came, its own box alone
            assert got == [SEALED_EXEC_MAGIC + header + msgpack.packb(boxes[rank])]
            w.send_multipart(to_wire(encode(Done(self.sid, name, rank, {0: _BOX}, _STATS))))
        result = self._next(self.driver, JobResult, counted)
        assert result.job == name and result.error is None


def _calls(root: Path | None, jobs: int = 10, sealed: bool = False) -> tuple[float, dict[str, int]]:
    """Python calls per job at the broker, and how many of them each function made;
    ``sealed``: the driver's Exec in the sealed shape (:meth:`_Cluster.sealed_job`)."""
    cluster = _Cluster(root)
    job = cluster.sealed_job if sealed else cluster.job
    names: dict[str, int] = {}

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_name
            names[name] = names.get(name, 0) + 1

    try:
        for _ in range(3):  # warm: the ranks' program, first uses, the first header kept
            job(None)
        # what earlier tests left for the garbage collector is collected now, not among
        # the counted calls (their __del__s and weakref callbacks: 53.3 in a full run)
        gc.collect()
        for _ in range(jobs):
            job(count)
    finally:
        cluster.close()
    return sum(names.values()) / jobs, names


# 634fe27 made 49 calls per job in plaintext and 55 in secure mode: frame_identity and,
# inside pyzmq's Frame.get, its version check, for each of the job's 3 messages (its Exec
# and 2 Dones; ~4.5k instructions each, the call and its checks ~1.1k of it). The loop
# reads the frame's User-Id itself: 52 (the version check is pyzmq's own).
def test_secure_mode_adds_one_python_call_per_message_at_the_broker(tmp_path: Path) -> None:
    # A turn whose timers fall due among the counted jobs adds calls (seen under load: 4.4
    # more over 20 jobs) and never takes any away: the fewest of three counts is the jobs'.
    plain = min(_calls(None, jobs=20)[0] for _ in range(3))
    counted = [_calls(tmp_path / str(i), jobs=20) for i in range(3)]
    secure = min(per_job for per_job, _ in counted)
    print(f"broker: {plain} Python calls per job in plaintext, {secure} in secure mode")
    assert all("frame_identity" not in names for _, names in counted)
    # 3 messages, one call each, and half a call of slack
    assert secure - plain <= 3.5


def _turned_raw(broker: Broker, sock: zmq.Socket[Any], count: Any) -> list[bytes]:
    """The next sealed Exec to ``sock`` as its frames (anything before it skipped: the
    welcome, the program), ``broker``'s loop turned by hand until it comes (counted by
    ``count`` if given)."""
    return turned_frames(broker, sock, lambda f: f[0].startswith(SEALED_EXEC_MAGIC), count, 2000)


# A repeat sealed Exec read through _handle (SealedExecReaders.read: read_hot_header,
# _handle, read, repeat_header, record, _repeat_boxes) made 41.0 calls per job; read in the
# loop (repeat_frame, repeat_sealed_boxes), 37.0. Half a call of margin.
def test_a_sealed_repeat_exec_is_read_inline_in_the_loop(tmp_path: Path) -> None:
    """A driver's repeat sealed Exec is read in the loop itself (one call: the header
    compared, the boxes cut, in ``RepeatExecs.repeat_sealed_boxes``), not through
    ``_handle`` and the readers' full-path calls; and costs no more calls than a plain
    Exec over CurveZMQ."""
    counted = [_calls(tmp_path / str(i), sealed=True) for i in range(3)]
    per_job = min(per_job for per_job, _ in counted)
    plain_secure = min(_calls(tmp_path / f"p{i}", jobs=10)[0] for i in range(3))
    print(f"broker: {per_job} Python calls per sealed job, {plain_secure} per plain secure job")
    for _, seen in counted:
        assert seen.get("repeat_sealed_boxes") == 10  # every counted job's Exec, once
        for slow in ("_handle", "_route", "_repeat_boxes", "repeat_header", "read_sealed_exec"):
            assert slow not in seen, slow
    assert per_job <= 37.5
    assert per_job < plain_secure  # fewer than a plain Exec's (its lean read, its copy)
