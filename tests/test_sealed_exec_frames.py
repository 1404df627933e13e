"""A secure Exec whose boxes follow one common header (``mpl.wire.sealed_exec``), attacked.

The broker checks the driver's frame (one header, bindings empty, then one box per rank,
each a bin of 1 to ``MAX_BOX_BYTES`` bytes, and nothing else) and forwards each rank the
header and its box. A hostile broker (the tap of ``test_sealed_broker``, rewriting what
the broker sends) that swaps two ranks' boxes, splices a box onto another job's header,
reorders, drops or adds boxes or frames, or sends an oversized or empty box gets every such
message refused and counted by the worker, with nothing run; a driver whose boxes do not
add up gets its job refused by the broker, counted, with nothing forwarded. Either way the
next genuine job runs once and the cluster keeps serving.
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers import mutated, wait_until
from test_sealed_broker import Frames, Setup, Wire

import mpl.driver as mp
from mpl.wire.codec import MAGIC_FRAME, MAX_HEADER_BYTES, decode, encode, from_wire, to_wire
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Exec
from mpl.wire.sealed_exec import (
    MAX_BOX_BYTES,
    SEALED_EXEC_MAGIC,
    is_sealed_exec,
    read_sealed_exec,
    split_own,
)

BOX = b"mpl-box\x01" + bytes(range(70))  # a compact box's length (never opened here)
pack = msgpack.packb


def _header(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "session": "s",
        "job": "j",
        "digest": "d",
        "ranks": (0, 1),
        "bindings": {},
        "inline": (0,),
        "timeout_s": 5.0,
    }
    base.update(fields)
    return bytes(encode(Exec(**base))[1])


def test_the_broker_reads_a_sealed_exec_of_one_box_per_rank() -> None:
    header = _header()
    frames = [SEALED_EXEC_MAGIC, header + pack(BOX) + pack(BOX[::-1])]
    read, head, boxes = read_sealed_exec(frames, 2)
    assert read == Exec("s", "j", "d", (0, 1), {}, (0,), 5.0)
    assert head == header and boxes == [pack(BOX), pack(BOX[::-1])]  # each box as it came
    assert split_own(head + boxes[1]) == (header, BOX[::-1])  # what a worker reads of its own


def test_mutated_one_frame_sealed_execs_are_read_or_refused_with_a_protocol_error() -> None:
    """The sealed Exec's whole frame on the wire (magic, header, boxes), mutated anywhere,
    the magic included: the broker's reading takes it only with the magic intact, one box
    per rank after a header ``decode`` reads, else raises ProtocolError and nothing else."""
    rng = random.Random(4)
    (genuine,) = to_wire([SEALED_EXEC_MAGIC, _header() + pack(BOX) + pack(BOX[::-1])])
    taken = 0
    for _ in range(3000):
        frames = from_wire([mutated(genuine, rng)])
        if not is_sealed_exec(frames):
            continue  # a broker reads it as any other message: decode's to refuse
        try:
            read, head, boxes = read_sealed_exec(frames, 2)
        except ProtocolError:
            continue
        taken += 1
        assert len(boxes) == len(read.ranks) and decode([MAGIC_FRAME, head]) == read
    assert 0 < taken < 3000


def test_the_broker_refuses_a_sealed_exec_for_more_ranks_than_its_cluster_has() -> None:
    # a header naming 3 ranks (and 3 boxes) to a broker of 2: refused before any box is
    # read, so no sender can have the header copied once per rank it claims
    frames = [SEALED_EXEC_MAGIC, _header(ranks=(0, 1, 2)) + pack(BOX) * 3]
    with pytest.raises(ProtocolError, match="3 ranks, in a cluster of 2"):
        read_sealed_exec(frames, 2)
    assert read_sealed_exec(frames, 3)[2] == [pack(BOX)] * 3


_BIG = b"\xc6" + (MAX_BOX_BYTES + 1).to_bytes(4, "big") + b"x" * (MAX_BOX_BYTES + 1)


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([SEALED_EXEC_MAGIC, _header()], "2 ranks carries 0 boxes"),
        ([SEALED_EXEC_MAGIC, _header() + pack(BOX)], "2 ranks carries 1 boxes"),
        ([SEALED_EXEC_MAGIC, _header() + pack(BOX) * 3], "2 ranks carries more"),
        ([SEALED_EXEC_MAGIC, _header(ranks=(0,)) + pack(BOX) * 2], "1 ranks carries more"),
        ([SEALED_EXEC_MAGIC, _header() + pack(BOX) + b"\xc4\x00"], "box of 2 bytes is no box"),
        ([SEALED_EXEC_MAGIC, _header() + pack(BOX) + b"\xc4\x50" + BOX[:10]], "does not read"),
        ([SEALED_EXEC_MAGIC, _header() + pack(BOX) + _BIG], "is no box"),
        ([SEALED_EXEC_MAGIC, _header() + pack(BOX) + pack("a str")], "is no box"),
        ([SEALED_EXEC_MAGIC, _header(bindings={0: BOX}) + pack(BOX) * 2], "carries bindings"),
        ([SEALED_EXEC_MAGIC, pack(BOX) + _header() + pack(BOX)], "not a \\[tag"),
        ([SEALED_EXEC_MAGIC, pack(["cancel", "s", "j", "r"]) + pack(BOX) * 2], "cancel"),
        ([SEALED_EXEC_MAGIC, b"\xc1" + pack(BOX) * 2], "does not read"),
        ([SEALED_EXEC_MAGIC, _header(), pack(BOX), pack(BOX)], "magic and one frame"),
        ([MAGIC_FRAME, _header() + pack(BOX) * 2], "magic and one frame"),
    ],
)
def test_the_broker_refuses_a_sealed_exec_whose_boxes_do_not_add_up(
    frames: list[Any], why: str
) -> None:
    with pytest.raises(ProtocolError, match=why):
        read_sealed_exec(frames, 2)


# -- through a real broker and workers ---------------------------------------------------


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    made = Setup(tmp_path, True)
    yield made
    made.close()


def _job(path: Path) -> Callable[[], Any]:
    """A job on both ranks that leaves a mark per rank it ran on."""

    def mark() -> int:
        with open(path, "a") as out:
            out.write("ran\n")
        return 1

    return mp.function(lambda: mp.simp.pcall((0, 1), mark))


def _marks(path: Path) -> int:
    return path.read_text().count("ran") if path.exists() else 0


def _is_sealed_exec(frames: Frames) -> bool:
    return bytes(frames[0]) == SEALED_EXEC_MAGIC


def _own(frames: Frames) -> tuple[bytes, bytes]:
    """A rank's sealed Exec: its header and its box."""
    return split_own(bytes(frames[1]))


def _errors(setup: Setup) -> list[int]:
    return [w.protocol_errors for w in setup.workers]


def _rank_peers(setup: Setup) -> dict[int, bytes]:
    return {r: e.peer for r, e in setup.broker.state.registry.by_rank.items()}


# what a hostile broker sends rank 0 instead of its sealed Exec (the genuine one follows):
# each is refused without an answer, counted, and runs nothing
def _box_dropped(frames: Frames) -> Frames:
    return [frames[0], _own(frames)[0]]


def _frame_dropped(frames: Frames) -> Frames:  # on the wire: its magic alone
    return [frames[0], b""]


def _box_added(frames: Frames) -> Frames:
    return [frames[0], bytes(frames[1]) + pack(_own(frames)[1])]


def _frame_added(frames: Frames) -> Frames:  # on the wire: a buffer frame after it
    return [*frames, frames[1]]


# on the wire as they are (wire version 4 takes a message's magic and header in ONE frame)
def _two_frames_v3(frames: Frames) -> Frames:  # wire version 3's shape and magic
    return Wire([b"MPS\x03", frames[1]])


def _two_frames(frames: Frames) -> Frames:  # this version's magic, in a frame of its own
    return Wire(frames)


def _empty_first_frame(frames: Frames) -> Frames:
    return Wire([b""])


def _short_first_frame(frames: Frames) -> Frames:
    return Wire([SEALED_EXEC_MAGIC[:3]])


def _header_too_large(frames: Frames) -> Frames:  # over MAX_HEADER_BYTES after the magic
    return Wire([MAGIC_FRAME + b"\x90" * (MAX_HEADER_BYTES + 1)])


def _reordered(frames: Frames) -> Frames:
    header, box = _own(frames)
    return [frames[0], pack(box) + header]


def _oversized(frames: Frames) -> Frames:
    return [frames[0], _own(frames)[0] + _BIG]


def _empty(frames: Frames) -> Frames:
    return [frames[0], _own(frames)[0] + b"\xc4\x00"]


def _bindings_too(frames: Frames) -> Frames:
    header, box = _own(frames)
    msg = decode([MAGIC_FRAME, header], unpickle=False)
    assert isinstance(msg, Exec)
    return [frames[0], _header(**{**msg.__dict__, "bindings": {0: box}}) + pack(box)]


@pytest.mark.parametrize(
    "forge",
    [
        _box_dropped,
        _frame_dropped,
        _box_added,
        _frame_added,
        _reordered,
        _oversized,
        _empty,
        _bindings_too,
        _two_frames_v3,
        _two_frames,
        _empty_first_frame,
        _short_first_frame,
        _header_too_large,
    ],
    ids=lambda f: f.__name__,
)
def test_a_worker_refuses_and_counts_a_malformed_sealed_exec_and_runs_the_genuine_once(
    setup: Setup, tmp_path: Path, forge: Callable[[Frames], Frames]
) -> None:
    path = tmp_path / "marks"
    peers = _rank_peers(setup)
    forged: list[Frames] = []

    def rewrite(peer: bytes, frames: Frames) -> list[tuple[bytes, Frames]]:
        if peer == peers[0] and _is_sealed_exec(frames):
            setup.tap.rewrite = None
            forged.append(forge(frames))
            return [(peer, forged[0]), (peer, frames)]  # the forgery, then the genuine
        return [(peer, frames)]

    with setup.ctx:
        job = _job(path)
        assert mp.fetch(job()) is not None  # the program on both ranks, a first job
        assert _marks(path) == 2
        before = _errors(setup)
        setup.tap.rewrite = rewrite
        mp.fetch(job())
        assert forged  # (it was a sealed Exec of this shape)
        assert _marks(path) == 4  # the genuine job ran once on each rank, the forgery never
        wait_until(lambda: _errors(setup)[0] > before[0], 5, "the forgery counted")
        assert _errors(setup) == [before[0] + 1, before[1]]
        mp.fetch(job())  # and the cluster keeps serving
        assert _marks(path) == 6


def test_a_worker_refuses_another_ranks_box_swapped_onto_its_exec(
    setup: Setup, tmp_path: Path
) -> None:
    path = tmp_path / "marks"
    peers = _rank_peers(setup)
    held: list[Frames] = []

    def swap(peer: bytes, frames: Frames) -> list[tuple[bytes, Frames]]:
        if not _is_sealed_exec(frames):
            return [(peer, frames)]
        if peer == peers[0]:  # kept until rank 1's comes: then each gets the other's box
            held.append(frames)
            return []
        setup.tap.rewrite = None
        (mine,) = held
        header, box = _own(mine)
        other_header, other_box = _own(frames)
        assert header == other_header  # every rank gets the one header
        return [
            (peers[0], [mine[0], header + pack(other_box)]),
            (peer, [frames[0], other_header + pack(box)]),
        ]

    with setup.ctx:
        job = _job(path)
        mp.fetch(job())
        before = _errors(setup)
        setup.tap.rewrite = swap
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            mp.fetch(job())
        wait_until(lambda: _errors(setup) == [e + 1 for e in before], 5, "both refusals")
        assert _marks(path) == 2  # only the first job's
        mp.fetch(job())
        assert _marks(path) == 4


def test_a_worker_refuses_a_box_spliced_onto_another_jobs_header(
    setup: Setup, tmp_path: Path
) -> None:
    path = tmp_path / "marks"
    peers = _rank_peers(setup)
    kept: list[Any] = []

    def record(peer: bytes, frames: Frames) -> list[tuple[bytes, Frames]]:
        if peer == peers[0] and _is_sealed_exec(frames) and not kept:
            kept.append(_own(frames)[1])
        return [(peer, frames)]

    def splice(peer: bytes, frames: Frames) -> list[tuple[bytes, Frames]]:
        if peer == peers[0] and _is_sealed_exec(frames):
            setup.tap.rewrite = None
            # the last job's box after this job's header
            return [(peer, [frames[0], _own(frames)[0] + pack(kept[0])])]
        return [(peer, frames)]

    with setup.ctx:
        job = _job(path)
        mp.fetch(job())  # the program sent first (a job the general way)
        setup.tap.rewrite = record
        mp.fetch(job())
        assert _marks(path) == 4 and kept
        before = _errors(setup)
        setup.tap.rewrite = splice
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            mp.fetch(job())
        wait_until(lambda: _errors(setup)[0] == before[0] + 1, 5, "the refusal counted")
        # rank 1 runs its genuine part (maybe after the job failed), rank 0 nothing
        wait_until(lambda: _marks(path) == 5, 5, "rank 1's part")
        mp.fetch(job())
        assert _marks(path) == 7


# what a driver sends the broker instead of its sealed Exec (the magic frame kept: it
# carries the connection's authenticated identity): refused by the broker, forwarded nowhere
def _split(frames: Frames) -> tuple[bytes, list[bytes]]:
    """A driver's sealed Exec (routing id first): its header, and its boxes as bins."""
    _, header, boxes = read_sealed_exec([SEALED_EXEC_MAGIC, bytes(frames[2])], 2)
    return header, boxes


def _one_box_short(frames: Frames) -> Frames:
    head, bins = _split(frames)
    return [*frames[:2], head + bins[0]]


def _one_box_more(frames: Frames) -> Frames:
    head, bins = _split(frames)
    return [*frames[:2], head + b"".join(bins) + bins[0]]


def _box_too_large(frames: Frames) -> Frames:
    head, bins = _split(frames)
    return [*frames[:2], head + bins[0] + _BIG]


def _ranks_claimed(frames: Frames) -> Frames:
    head, bins = _split(frames)
    msg = decode([MAGIC_FRAME, head], unpickle=False)
    assert isinstance(msg, Exec) and msg.ranks == (0, 1)
    return [*frames[:2], _header(**{**msg.__dict__, "ranks": (0,)}) + b"".join(bins)]


@pytest.mark.parametrize(
    "forge",
    [_one_box_short, _one_box_more, _box_too_large, _ranks_claimed],
    ids=lambda f: f.__name__,
)
def test_the_broker_refuses_and_counts_sealed_exec_frames_that_do_not_add_up(
    setup: Setup, tmp_path: Path, forge: Callable[[Frames], Frames]
) -> None:
    path = tmp_path / "marks"

    def take(frames: Frames) -> Frames:  # routing id first
        if len(frames) == 3 and bytes(frames[1]) == SEALED_EXEC_MAGIC:
            setup.tap.take = None
            return forge(frames)
        return frames

    with setup.ctx:
        job = _job(path)
        mp.fetch(job())
        counters = setup.broker.state.counters
        refused, before = counters["protocol_errors"], _errors(setup)
        setup.tap.take = take
        with pytest.raises(mp.MplError, match="sealed Exec"):
            mp.fetch(job())
        assert counters["protocol_errors"] == refused + 1
        assert _marks(path) == 2 and _errors(setup) == before  # nothing reached a worker
        mp.fetch(job())
        assert _marks(path) == 4


def test_a_sealed_exec_naming_more_ranks_than_the_cluster_costs_the_broker_only_its_size(
    setup: Setup, tmp_path: Path
) -> None:
    # What a hostile driver (or any admitted key) sends: a header naming 8,000 ranks and a
    # 1-byte box for each, a ~40 KB frame. The broker joined the header to every box
    # before it checked the ranks (and the sender): ~190 MB built for one frame, and a
    # longer header under the 256 KiB bound made it gigabytes. Now the ranks are checked
    # against the cluster first, and a header is joined to a box only for a job it sends.
    path, claimed = tmp_path / "marks", tuple(range(8000))

    def take(frames: Frames) -> Frames:  # routing id first
        if len(frames) == 3 and bytes(frames[1]) == SEALED_EXEC_MAGIC:
            setup.tap.take = None
            head, _ = _split(frames)
            msg = decode([MAGIC_FRAME, head], unpickle=False)
            assert isinstance(msg, Exec)
            forged = _header(**{**msg.__dict__, "ranks": claimed}) + pack(b"x") * len(claimed)
            return [*frames[:2], forged]
        return frames

    with setup.ctx:
        job = _job(path)
        mp.fetch(job())
        counters = setup.broker.state.counters
        refused, before = counters["protocol_errors"], _errors(setup)
        setup.tap.take = take
        tracemalloc.start()
        try:
            with pytest.raises(mp.MplError, match="sealed Exec for 8000 ranks, in a cluster of 2"):
                mp.fetch(job())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 * 1024 * 1024, f"{peak} bytes at the peak for a ~40 KB frame"
        assert counters["protocol_errors"] == refused + 1
        assert _marks(path) == 2 and _errors(setup) == before  # nothing reached a worker
        mp.fetch(job())
        assert _marks(path) == 4
