"""A secure Exec whose boxes are frames of their own (``mpl.wire.sealed_exec``), attacked.

The broker checks the driver's frames (one common header, bindings empty, then one box
frame per rank, each 1 to ``MAX_BOX_BYTES`` bytes) and forwards each rank the header and its
box frame. A hostile broker (the tap of ``test_sealed_broker``, rewriting what the broker
sends) that swaps two ranks' boxes, splices a box onto another job's header, reorders,
drops or adds frames, or sends an oversized box gets every such message refused and counted
by the worker, with nothing run; a driver whose frames do not add up gets its job refused
by the broker, counted, with nothing forwarded. Either way the next genuine job runs once
and the cluster keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers import wait_until
from test_sealed_broker import Frames, Setup

import mpl.driver as mp
from mpl.wire.codec import MAGIC_FRAME, decode, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Exec
from mpl.wire.sealed_exec import MAX_BOX_BYTES, SEALED_EXEC_MAGIC, read_sealed_exec

BOX = b"mpl-box\x01" + bytes(range(70))  # a compact box's length (never opened here)


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


def test_the_broker_reads_a_sealed_exec_of_one_box_frame_per_rank() -> None:
    read = read_sealed_exec([SEALED_EXEC_MAGIC, _header(), BOX, BOX[::-1]])
    assert read == Exec("s", "j", "d", (0, 1), {}, (0,), 5.0)


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([SEALED_EXEC_MAGIC, _header()], "without boxes"),
        ([SEALED_EXEC_MAGIC, _header(), BOX], "2 ranks carries 1 box"),
        ([SEALED_EXEC_MAGIC, _header(), BOX, BOX, BOX], "2 ranks carries 3 box"),
        ([SEALED_EXEC_MAGIC, _header(ranks=(0,)), BOX, BOX], "1 ranks carries 2 box"),
        ([SEALED_EXEC_MAGIC, _header(), BOX, b""], "box frame of 0 bytes"),
        ([SEALED_EXEC_MAGIC, _header(), BOX, b"x" * (MAX_BOX_BYTES + 1)], "box frame of"),
        ([SEALED_EXEC_MAGIC, _header(), BOX, 7], "box frame is a int"),
        ([SEALED_EXEC_MAGIC, _header(bindings={0: BOX}), BOX, BOX], "carries bindings"),
        ([SEALED_EXEC_MAGIC, BOX, _header(), BOX], "not an mpl message|bad|header"),
        ([SEALED_EXEC_MAGIC, msgpack.packb(["cancel", "s", "j", "r"]), BOX, BOX], "cancel"),
        ([MAGIC_FRAME, _header(), BOX, BOX], "not a sealed Exec"),
    ],
)
def test_the_broker_refuses_sealed_exec_frames_that_do_not_add_up(
    frames: list[Any], why: str
) -> None:
    with pytest.raises(ProtocolError, match=why):
        read_sealed_exec(frames)


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


def _errors(setup: Setup) -> list[int]:
    return [w.protocol_errors for w in setup.workers]


def _rank_peers(setup: Setup) -> dict[int, bytes]:
    return {r: e.peer for r, e in setup.broker.state.registry.by_rank.items()}


# what a hostile broker sends rank 0 instead of its sealed Exec (the genuine one follows):
# each is refused without an answer, counted, and runs nothing
def _drop(frames: Frames) -> Frames:
    return frames[:2]


def _surplus(frames: Frames) -> Frames:
    return [*frames, frames[2]]


def _reorder(frames: Frames) -> Frames:
    return [frames[0], frames[2], frames[1]]


def _oversized(frames: Frames) -> Frames:
    return [*frames[:2], b"x" * (MAX_BOX_BYTES + 1)]


def _empty(frames: Frames) -> Frames:
    return [*frames[:2], b""]


def _bindings_too(frames: Frames) -> Frames:
    msg = decode([MAGIC_FRAME, bytes(frames[1])], unpickle=False)
    assert isinstance(msg, Exec)
    header = _header(**{**msg.__dict__, "bindings": {0: bytes(frames[2])}})
    return [frames[0], header, frames[2]]


@pytest.mark.parametrize(
    "forge",
    [_drop, _surplus, _reorder, _oversized, _empty, _bindings_too],
    ids=lambda f: f.__name__,
)
def test_a_worker_refuses_and_counts_a_malformed_sealed_exec_and_runs_the_genuine_once(
    setup: Setup, tmp_path: Path, forge: Callable[[Frames], Frames]
) -> None:
    path = tmp_path / "marks"
    peers = _rank_peers(setup)

    def rewrite(peer: bytes, frames: Frames) -> list[tuple[bytes, Frames]]:
        if peer == peers[0] and _is_sealed_exec(frames):
            setup.tap.rewrite = None
            return [(peer, forge(frames)), (peer, frames)]  # the forgery, then the genuine
        return [(peer, frames)]

    with setup.ctx:
        job = _job(path)
        assert mp.fetch(job()) is not None  # the program on both ranks, a first job
        assert _marks(path) == 2
        before = _errors(setup)
        setup.tap.rewrite = rewrite
        mp.fetch(job())
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
        return [(peers[0], [*mine[:2], frames[2]]), (peer, [*frames[:2], mine[2]])]

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
            kept.append(bytes(frames[2]))
        return [(peer, frames)]

    def splice(peer: bytes, frames: Frames) -> list[tuple[bytes, Frames]]:
        if peer == peers[0] and _is_sealed_exec(frames):
            setup.tap.rewrite = None
            return [(peer, [*frames[:2], kept[0]])]  # the last job's box, this job's header
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
def _one_box_short(frames: Frames) -> Frames:
    return frames[:-1]


def _one_box_more(frames: Frames) -> Frames:
    return [*frames, frames[-1]]


def _box_too_large(frames: Frames) -> Frames:
    return [*frames[:-1], b"x" * (MAX_BOX_BYTES + 1)]


def _ranks_claimed(frames: Frames) -> Frames:
    msg = decode([MAGIC_FRAME, bytes(frames[2])], unpickle=False)
    assert isinstance(msg, Exec) and msg.ranks == (0, 1)
    return [frames[0], frames[1], _header(**{**msg.__dict__, "ranks": (0,)}), *frames[3:]]


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
        if len(frames) > 2 and bytes(frames[1]) == SEALED_EXEC_MAGIC:
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
