"""The broker loop's inline reading of a repeat sealed Exec
(``SealedExecReaders.repeat_frame``, one walk of the frame as received) next to the path
it skips (``SealedExecReaders.read`` of the frame cut into magic and rest, and the full
read ``read_sealed_exec``), on mutations of real repeat frames: bytes flipped or changed,
the frame cut, bytes added, boxes swapped, dropped or added. Whatever the inline reading
takes, both others take as the same ``Exec`` (every field), header and boxes; whatever
either refuses, it does not take (it answers None, and the loop reads the frame as before).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
from helpers import mutated
from test_secure_broker_counts import _BOX, _STATS, _Cluster, _turned_raw

from mpl.wire.codec import encode, to_wire
from mpl.wire.control import Refused
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Done, Exec, JobResult
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, SealedExecReaders, read_sealed_exec

_SESSION = "s" + "5" * 16 + "~" + "6" * 16
pack = msgpack.packb


def _header(job: str, ranks: tuple[int, ...]) -> bytes:
    exe = Exec(
        session=_SESSION,
        job=job,
        digest="d" * 64,
        ranks=ranks,
        bindings={},
        inline=(0,),
        timeout_s=5.0,
    )
    return bytes(encode(exe)[1])


def _boxes(rng: random.Random, count: int) -> list[bytes]:
    """``count`` boxes as they come (bin heads and all): compact boxes' sizes, a bin16 now
    and then."""
    sizes = [rng.choice((1, 40, 120, 255, 256, 300, 2000)) for _ in range(count)]
    return [pack(bytes(rng.randrange(256) for _ in range(n))) for n in sizes]


def _primed(first: bytes) -> SealedExecReaders:
    """Readers that read ``first`` (a sealed Exec's frame after its magic) in full and kept
    its header, as the broker's are after a sender's first job of a program."""
    readers = SealedExecReaders()
    readers.read(b"p", [SEALED_EXEC_MAGIC, first], 8)
    return readers


def _changed(rng: random.Random, header: bytes, boxes: list[bytes]) -> bytes:
    """A repeat frame (after its magic) with one change: a mutation anywhere, or in the job
    id's bytes, or its boxes swapped, dropped, doubled or cut at a box's head."""
    whole = header + b"".join(boxes)
    kind = rng.randrange(6)
    if kind == 0:
        return mutated(whole, rng)
    if kind == 1:  # inside the job id, or a box head, or just around them
        at = rng.choice((len(header) - 40, len(header) - 30, len(header))) + rng.randrange(-3, 4)
        return whole[:at] + bytes([rng.randrange(256)]) + whole[at + 1 :]
    if kind == 2:
        return header + b"".join(reversed(boxes))  # swapped: still read (unopened here)
    if kind == 3:
        return header + b"".join(boxes[:-1])  # a box short
    if kind == 4:
        return header + b"".join(boxes) + boxes[0]  # a box more
    return header + b"".join(boxes) + bytes(rng.randrange(1, 4))  # trailing bytes


def _compare(first: bytes, data: bytes, max_ranks: int) -> str:
    """What the inline reading makes of ``data`` (readers primed with ``first``) next to
    the slow path's: "taken" (and the same as both other reads), "refused" (by all), or
    "slow" (left to the slow path)."""
    readers = _primed(first)
    frames = [SEALED_EXEC_MAGIC, data]
    try:
        want: Any = read_sealed_exec(frames, max_ranks)
    except ProtocolError:
        want = None
    got = readers.repeat_frame(b"p", SEALED_EXEC_MAGIC + data, max_ranks)
    if got is None:
        return "refused" if want is None else "slow"
    assert want is not None, "the inline read took what the full read refuses"
    read, raw = got
    exe, head, boxes = want
    assert read == exe and read.__dict__ == exe.__dict__
    assert raw == [SEALED_EXEC_MAGIC, head, *boxes]
    assert raw[0] is SEALED_EXEC_MAGIC  # the state tells the shape by this constant
    assert all(type(part) is bytes for part in raw)
    # the path the loop skips (the readers' read of the frame cut in two) says the same
    assert _primed(first).read(b"p", frames, max_ranks) == want
    return "taken"


def test_every_mutated_repeat_is_taken_inline_only_as_the_full_read_takes_it() -> None:
    rng = random.Random(3131)
    outcomes = {"taken": 0, "refused": 0, "slow": 0}
    for ranks in ((0,), (0, 1), (2, 0, 1), tuple(range(8))):
        first = _header("a" * 24, ranks) + b"".join(_boxes(rng, len(ranks)))
        for n in range(500):
            job = f"{n:024x}" if n % 5 else f"{n:023x}"  # sometimes another length
            header = _header(job, ranks)
            boxes = _boxes(rng, len(ranks))
            data = header + b"".join(boxes) if n % 4 == 0 else _changed(rng, header, boxes)
            max_ranks = len(ranks) - (n % 7 == 0)  # now and then one rank too many
            outcomes[_compare(first, data, max_ranks)] += 1
    # each outcome well represented: the genuine repeats, the mutants both ways
    taken, refused, slow = outcomes["taken"], outcomes["refused"], outcomes["slow"]
    assert taken > 500 and refused > 500 and slow > 100, outcomes


def test_the_inline_reading_keeps_nothing_and_reads_only_a_kept_senders_repeat() -> None:
    rng = random.Random(7)
    first = _header("a" * 24, (0, 1)) + b"".join(_boxes(rng, 2))
    readers = _primed(first)
    repeat = _header("b" * 24, (0, 1)) + b"".join(_boxes(rng, 2))
    assert readers.repeat_frame(b"q", SEALED_EXEC_MAGIC + repeat, 2) is None  # no other's
    assert readers.repeat_frame(b"p", b"MPX\x04" + repeat, 2) is None  # another magic
    other = _header("c" * 24, (1, 0)) + b"".join(_boxes(rng, 2))  # another program
    assert readers.repeat_frame(b"p", SEALED_EXEC_MAGIC + other, 2) is None
    assert b"q" not in readers._readers  # nothing kept by the inline reading
    before = readers._readers[b"p"].repeats
    got = readers.repeat_frame(b"p", SEALED_EXEC_MAGIC + repeat, 2)
    assert got is not None and got[0].job == "b" * 24
    assert readers._readers[b"p"].repeats == before + 1
    # a record of its own: no map shared with the kept one
    kept = readers._readers[b"p"].last
    assert kept is not None and got[0].bindings == {} and got[0].bindings is not kept.bindings


def test_the_broker_loop_refuses_a_bad_repeat_as_the_full_path_does(tmp_path: Path) -> None:
    """A real secure broker (its loop turned by hand, ``test_secure_broker_counts``): after
    a sender's first sealed Exec of a program (read in full, kept), repeats whose boxes
    are short, cut or one too many are refused as bad messages, as the full read refuses
    them, with nothing sent to a rank; a good repeat after them runs; and the same repeat
    from a worker's connection is refused for who sent it."""
    cluster = _Cluster(tmp_path)
    try:
        sid, digest = cluster.sid, cluster.graph.digest
        boxes = [_BOX + b"\x00", _BOX + b"\x01"]

        def frame(name: str, these: list[bytes]) -> bytes:
            header = bytes(encode(Exec(sid, name, digest, (0, 1), {}, (0,)))[1])
            return SEALED_EXEC_MAGIC + header + b"".join(map(pack, these))

        def run(name: str) -> None:
            cluster.driver.send_multipart([frame(name, boxes)])
            for rank, w in enumerate(cluster.workers):
                got = _turned_raw(cluster.broker, w, None)
                assert got[0].endswith(pack(boxes[rank]))
                w.send_multipart(to_wire(encode(Done(sid, name, rank, {0: _BOX}, _STATS))))
            result = cluster._next(cluster.driver, JobResult, None)
            assert result.job == name and result.error is None

        run("a" * 24)  # read in full, its header kept
        reader = cluster.broker._sealed_execs._readers[b"drv:secure-counts/0001"]
        errors = cluster.broker.state.counters["protocol_errors"]
        for bad in (
            frame("b" * 24, boxes[:1]),  # a box short
            frame("b" * 24, boxes)[:-1],  # the last box cut
            frame("b" * 24, [*boxes, boxes[0]]),  # a box more
            frame("b" * 24, boxes) + b"\x00",  # a byte after the last box
        ):
            cluster.driver.send_multipart([bad])
            refused = cluster._next(cluster.driver, Refused, None)
            assert refused.error.kind == "ProtocolError"
            assert "bad message" in refused.error.message
        assert cluster.broker.state.counters["protocol_errors"] == errors + 4
        assert not any(w.poll(0) for w in cluster.workers)  # nothing went to a rank
        before = reader.repeats
        run("c" * 24)  # a good repeat, read inline
        assert reader.repeats == before + 1
        # a worker's connection sends the driver's repeat: refused for who it is
        worker = cluster.workers[0]
        for name in ("d" * 24, "e" * 24):  # read in full, then as a repeat
            worker.send_multipart([frame(name, boxes)])
            refused = cluster._next(worker, Refused, None)
            assert "may not send" in refused.error.message
        assert cluster.broker._sealed_execs._readers[b"\x00w0"].repeats == 1  # (inline)
        assert not cluster.workers[1].poll(0)
    finally:
        cluster.close()
