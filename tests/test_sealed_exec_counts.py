"""What a secure Exec whose boxes follow one common header (``mpl.wire.sealed_exec``) costs
the broker, counted (never timed): Python calls per job and per rank, and no header cut or
encoded per rank. Fed through the broker's own ``_route`` (the rig of
``test_broker_counts``: a real ``Broker`` whose ROUTER is a recorder), with the frames a
secure driver and its workers send, next to the same job in the codec's shape (every
rank's box inside the header's bindings, what 634fe27 sent) and in plaintext."""

from __future__ import annotations

import gc
import sys
from collections import Counter
from typing import Any

import msgpack
import zmq
from test_broker_counts import STATS, _python_calls, _Rig

from mpl.broker import inbox
from mpl.wire.codec import encode, to_wire
from mpl.wire.jobs import Done, Exec
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, split_own

_FRAME_GET = inbox._frame_get  # (_route's: the rig feeds the broker there)
BOX = b"mpl-box\x01\x0edriver:analyst" + bytes(range(60))  # a sealed None's length


class _SealedRig(_Rig):
    """The rig's jobs as a secure driver sends them: each rank a sealed box (here: bytes
    the broker never opens), in the sealed Exec's shape or (``boxed``) the codec's."""

    def __init__(self, world: int, boxed: bool = False) -> None:
        super().__init__(world)
        self.boxed = boxed
        self.broker.secure = True  # it takes the sealed shape (a plaintext one refuses it)
        # no CURVE here, so these frames carry no User-Id (Frame.get refuses): the broker's
        # identity read is a stand-in saying "nobody", its own calls counted and taken off
        # (tests/test_secure_broker_counts.py counts the real read over CURVE)
        self.identity_reads = 0
        inbox._frame_get = self._no_identity

    def _no_identity(self, frame: Any, key: bytes) -> None:
        self.identity_reads += 1

    def close(self) -> None:
        inbox._frame_get = _FRAME_GET
        super().close()

    def frames(self) -> list[list[Any]]:
        self.jobs += 1
        job, ranks = f"j{self.jobs}", tuple(range(self.world))
        boxes = {r: BOX[:-1] + bytes([r]) for r in ranks}
        if self.boxed:
            exec_ = to_wire(encode(Exec(self.sid, job, self.graph.digest, ranks, boxes, (0,), 9)))
        else:
            header = encode(Exec(self.sid, job, self.graph.digest, ranks, {}, (0,), 9))[1]
            bins = b"".join(msgpack.packb(box) for box in boxes.values())
            exec_ = [SEALED_EXEC_MAGIC + bytes(header) + bins]  # one frame (wire v4)
        out = [[self.driver, *exec_]]
        for rank, peer in enumerate(self.workers):
            out.append([peer, *to_wire(encode(Done(self.sid, job, rank, {0: BOX}, STATS, {})))])
        return [[zmq.Frame(bytes(f)) for f in msg] for msg in out]


def _calls(rig: _Rig) -> float:
    try:
        for batch in [rig.frames() for _ in range(5)]:  # warm: first uses, caches
            for msg in batch:
                rig.feed(msg)
        rig.sent().clear()
        gc.collect()  # earlier tests' garbage (finalizers, weakref callbacks) not counted
        stand_in = rig.identity_reads if isinstance(rig, _SealedRig) else 0
        per_job = _python_calls(rig, 20)
        if isinstance(rig, _SealedRig):  # the stand-in's calls taken off
            per_job -= (rig.identity_reads - stand_in) / 20
        assert len(rig.sent()) == 20 * (rig.world + 1)  # an Exec per rank and one answer
    finally:
        rig.close()
    return per_job


# Measured: the sealed shape 55 calls per 2-rank job and 8 per added rank (its Exec out,
# its Done in); plaintext 54 and 8; the codec's shape (634fe27's secure Exec, its header cut
# for every rank in one call each: hot_spans.execs_for_ranks, actions.own_execs) 55 and 8.
# The sealed shape's gain is in instructions (no walk building a map and a record per rank,
# no encode): counted by callgrind, not here.
def test_a_sealed_execs_python_calls_per_job_and_per_rank_are_plaintexts() -> None:
    # what else runs meanwhile (a collection, a timer) only adds calls: the fewest of two
    plain = {w: min(_calls(_Rig(w)) for _ in range(2)) for w in (2, 16)}
    sealed = {w: min(_calls(_SealedRig(w)) for _ in range(2)) for w in (2, 16)}
    boxed = {w: min(_calls(_SealedRig(w, boxed=True)) for _ in range(2)) for w in (2, 16)}
    per_rank = {k: (v[16] - v[2]) / 14 for k, v in (("plain", plain), ("sealed", sealed))}
    print(f"plain {plain}, sealed {sealed}, boxed (634fe27's shape) {boxed}, {per_rank}")
    assert per_rank["sealed"] <= per_rank["plain"] + 0.1
    assert sealed[2] <= plain[2] + 1.5  # its reader: one call
    assert sealed[2] <= boxed[2] and sealed[16] <= boxed[16]


def test_no_rank_gets_a_header_cut_or_encoded_for_it() -> None:
    """Each rank gets the driver's header as it came and its own box after it: no walk over
    the header per rank (execs_for_ranks), no record per rank (own_execs), no encode."""
    rig = _SealedRig(4)
    called: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            called[frame.f_code.co_name] += 1

    try:
        for msg in rig.frames()[:1]:  # warm: each worker gets the program first
            rig.feed(msg)
        rig.sent().clear()
        exec_, *_ = rig.frames()
        sys.setprofile(count)
        try:
            rig.feed(exec_)
        finally:
            sys.setprofile(None)
        sent = rig.sent()
    finally:
        rig.close()
    assert called["execs_for_ranks"] == called["own_execs"] == called["encode"] == 0
    data = bytes(exec_[1])[4:]  # the magic, the header, then 4 bins of len(BOX) + 2 bytes each
    header, _ = split_own(data[: len(data) - 3 * (len(BOX) + 2)])
    assert len(sent) == 4
    for rank, frames in enumerate(sent):
        assert len(frames) == 2 and frames[0] == rig.workers[rank]  # one frame (wire v4)
        assert bytes(frames[1])[:4] == SEALED_EXEC_MAGIC
        own_header, box = split_own(bytes(frames[1])[4:])
        assert own_header == header and box == BOX[:-1] + bytes([rank])
