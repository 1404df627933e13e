"""The broker's read of a worker's repeat Done by comparison (``mpl.wire.done_repeat``)
against its full read (``mpl.wire.hot.read_done_header``).

A repeat is read from the bytes outside its job id and stats blob being the kept Done's, so
it must read exactly what the full read reads and accept nothing the full read refuses:
compared here on repeats and on thousands of mutated ones. Then the broker's loop: a
trivial job's Dones are read by comparison (no msgpack read per rank), and a Done that
differs from its sender's last one anywhere but its two spans (another rank, say) takes the
full read and the checks it always had.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import mutated
from test_broker_batch_counts import _BatchedShell
from test_broker_counts import STATS, _Shell

from mpl.wire import hot
from mpl.wire.codec import MAGIC_FRAME, encode, to_wire
from mpl.wire.done_repeat import RepeatDones
from mpl.wire.hot import DoneRead, read_done_header
from mpl.wire.jobs import Done, Exec, JobResult
from mpl.wire.run_stats import pack_stats

_FIELDS = ("session", "job", "rank", "values", "stats", "metas", "saved")


def _one(done: Done) -> bytes:
    """A Done as the broker receives it from a worker: one frame, the magic and the header."""
    magic, header = encode(done)
    assert bytes(magic) == MAGIC_FRAME
    return bytes(magic) + bytes(header)


def _fields(read: DoneRead | None) -> tuple[Any, ...] | None:
    return None if read is None else tuple(getattr(read, f) for f in _FIELDS)


def _full(one: bytes) -> tuple[Any, ...] | None:
    if not one.startswith(MAGIC_FRAME):
        return None
    return _fields(read_done_header(one[4:]))


def _keep(reader: RepeatDones, one: bytes) -> None:
    """``reader`` keeps ``one`` (a Done's frame, read in full) to compare the next with."""
    read = read_done_header(one[4:])
    assert read is not None
    reader.keep(one, read)


def _kept(first: bytes, boxes: bool = False) -> RepeatDones:
    """A new reader (of boxed Dones if ``boxes``) that kept ``first``."""
    reader = RepeatDones(boxes=boxes)
    _keep(reader, first)
    return reader


def _mutants_read_alike(
    first: bytes, base: bytes, rng: random.Random, times: int, boxes: bool = False
) -> int:
    """``times`` mutations of ``base``, each given to a reader that kept ``first``: every one
    it reads as a repeat reads exactly as the full read reads it. How many it read so."""
    checked = 0
    for _ in range(times):
        reader = _kept(first, boxes)
        one = mutated(base, rng)
        full = _full(one)
        got = _fields(reader.repeat(one))
        if got is not None:  # read by comparison: exactly what the full read reads
            checked += 1
            assert got == full, one
    return checked


def _stats(i: int) -> bytes:
    return pack_stats(1e-5 * (i + 1), 1.7e9 + i, [[0, "pcall", 1e-6 * i, 1.1e-5 + i]])


_SHAPES: list[tuple[str, int, dict[int, Any], dict[int, str]]] = [
    ("s23ae17d5e1c8bff8", 0, {0: 1}, {0: "int64[]"}),  # a trivial job's
    ("sess", 5, {}, {}),
    ("sess", 3, {0: 2.5, 2: "text", 4: b"\x00\x01", 5: None, 6: True}, {0: "float64[]"}),
    ("sess", 1, {0: -(1 << 40)}, {0: "int64[]", 1: "x"}),
]


@pytest.mark.parametrize("shape", _SHAPES)
def test_a_repeat_reads_as_the_full_read(shape: tuple[Any, ...]) -> None:
    session, rank, values, metas = shape
    reader = _kept(_one(Done(session, "j0000000000000000", rank, values, _stats(0), metas)))
    for i in range(1, 20):
        one = _one(Done(session, f"j{i:016d}", rank, values, _stats(i), metas))
        full = _full(one)
        got = _fields(reader.repeat(one))
        assert got is not None and got == full
    assert reader.repeats == 19


def test_a_mutated_repeat_is_read_as_the_full_read_reads_it_or_left_to_it() -> None:
    rng = random.Random(29)
    checked = 0
    for session, rank, values, metas in _SHAPES:
        first = _one(Done(session, "jfirst0000000000", rank, values, _stats(0), metas))
        base = _one(Done(session, "jnext00000000000", rank, values, _stats(1), metas))
        checked += _mutants_read_alike(first, base, rng, 1500)
    assert checked > 500  # the job id's and the stats' bytes: mutations a repeat reads


def _box(i: int, size: int = 59) -> bytes:
    """A stand-in for a compact box: bytes of one length, different for every job."""
    return random.Random(i).randbytes(size)


def _boxed(job: str, i: int, rank: int = 1, size: int = 59, index: int = 0) -> bytes:
    """A secure trivial job's Done: its one value a box, sealed anew for every job."""
    return _one(Done("s" * 34, job, rank, {index: _box(i, size)}, _stats(i), {index: "int"}))


def test_a_repeat_whose_one_value_is_a_new_box_reads_as_the_full_read() -> None:
    """Secure mode: the box differs every job, as the job id and the stats do. The
    repeat takes its bytes as they come, as the full read does."""
    first = _boxed("j0000000000000000", 0)
    reader = _kept(first, boxes=True)
    for i in range(1, 20):
        one = _boxed(f"j{i:016d}", i)
        full = _full(one)
        got = _fields(reader.repeat(one))
        assert got is not None and got == full
        assert full[3] == {0: _box(i)}  # (full: a read, its values this job's box)
    assert reader.repeats == 19
    # a box of another length, or at another index: another layout, no repeat
    assert reader.repeat(_boxed("j0000000000000099", 99, size=60)) is None
    assert reader.repeat(_boxed("j0000000000000099", 99, index=1)) is None
    assert reader.repeat(_boxed("j0000000000000099", 99, rank=2)) is None
    # a plaintext reader compares a blob value with the rest: another blob, no repeat
    plain = _kept(first)  # (read again: the first read is the boxes reader's now)
    assert plain.repeat(_boxed("j0000000000000001", 1)) is None
    assert plain.repeat(_boxed("j0000000000000001", 0)) is not None


def test_a_mutated_repeat_of_a_boxed_done_is_read_as_the_full_read_reads_it_or_left_to_it() -> None:
    rng = random.Random(30)
    first = _boxed("jfirst0000000000", 0)
    base = _boxed("jnext00000000000", 1)
    checked = _mutants_read_alike(first, base, rng, 3000, boxes=True)
    assert checked > 600  # the job id's, the box's and the stats' bytes (918 seen)


def test_a_job_id_that_is_not_utf8_is_no_repeat() -> None:
    reader = _kept(_one(Done("sess", "jaaaa", 0, {0: 1}, STATS, {0: "int64[]"})))
    good = _one(Done("sess", "jbbbb", 0, {0: 1}, STATS, {0: "int64[]"}))
    at = good.index(b"jbbbb")
    bad = good[:at] + b"j\xff\xfebb" + good[at + 5 :]
    assert _full(bad) is None
    assert reader.repeat(bad) is None
    assert _fields(reader.repeat(good)) == _full(good)


def test_no_layout_is_kept_for_values_that_nest_or_a_header_not_packed_as_msgpack_does() -> None:
    nested = _one(Done("sess", "j1", 0, {0: [1, 2]}, STATS, {}))
    # the same Done with its session as a str8 (msgpack packs it as a fixstr): read in full
    # alike, but its bytes are not where the packing of what was read puts them
    plain = _one(Done("sess", "j1", 0, {0: 1}, STATS, {}))
    at = plain.index(b"\xa4sess")
    str8 = plain[:at] + b"\xd9\x04sess" + plain[at + 5 :]
    for one in (nested, str8):
        reader = _kept(one)
        assert reader.repeat(one) is None  # not even the same bytes: nothing kept


def test_a_sender_whose_every_done_differs_backs_off() -> None:
    """Values that change every job: no repeat to find. Layouts are made a few times per
    hundred Dones, not once per Done."""
    reader = RepeatDones()
    made = 0
    for i in range(400):
        one = _one(Done("sess", f"j{i:04d}", 0, {0: 1000 + i}, STATS, {0: "int64[]"}))
        assert reader.repeat(one) is None
        before = reader._shape
        _keep(reader, one)
        made += reader._shape is not before and reader._shape is not None
    assert made <= 8


def test_a_one_off_first_done_holds_up_the_repeats_after_it_briefly() -> None:
    """A sender's first Done differs from all after it (a secure session's set-up job):
    its layout is dropped after 8 misses, and the back-off before the next is made is 16
    Dones, not 64 (before: 72 Dones read in full before the first repeat)."""
    reader = RepeatDones()
    dones = [_one(Done("sess", "j0000", 0, {0: None}, STATS, {0: "NoneType"}))]
    dones += [_one(Done("sess", f"j{i:04d}", 0, {0: 1}, STATS, {0: "int"})) for i in range(1, 60)]
    full_reads = 0
    for one in dones:
        if reader.repeat(one) is not None:
            break
        full_reads += 1
        _keep(reader, one)
    assert full_reads == 1 + 8 + 16
    assert reader.repeats == 1


def full_done_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, count the broker's full reads of a Done header (its
    ``read_done_header``, called where no repeat was recognised: in the loop, or in a
    batch's) in the one-item list it returns; the monkeypatch puts the real reader back
    after the test."""
    import mpl.broker.daemon as broker_daemon
    import mpl.broker.inbox as broker_inbox

    count = [0]
    real = hot.read_done_header  # (the broker's, imported from here)

    def counted(data: Any) -> Any:
        count[0] += 1
        return real(data)

    monkeypatch.setattr(broker_daemon, "read_done_header", counted)  # the loop's
    monkeypatch.setattr(broker_inbox, "read_done_header", counted)  # a batch's
    return count


@contextlib.contextmanager
def counted_unpacks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count msgpack reads of Done headers (``read_done_header``'s ``hot._unpackb``) made
    inside the block, in the one-item list it yields; the real reader is back after."""
    count = [0]
    real = hot._unpackb

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(hot, "_unpackb", counted)
    try:
        yield count
    finally:
        monkeypatch.setattr(hot, "_unpackb", real)


def _counted_reads(world: int, monkeypatch: pytest.MonkeyPatch, jobs: int = 6) -> int:
    """msgpack reads of a Done header (read_done_header's) in ``jobs`` trivial jobs on
    ``world`` ranks through the broker's own loop, after two jobs of warm-up."""
    shell = _Shell(world)
    try:
        for _ in range(2):
            shell.job(lambda *_: None)
        with counted_unpacks(monkeypatch) as reads:
            for _ in range(jobs):
                shell.job(lambda *_: None)
    finally:
        shell.close()
    return reads[0]


def test_the_loop_reads_a_repeat_done_without_msgpack(monkeypatch: pytest.MonkeyPatch) -> None:
    # before mpl.wire.done_repeat: one read per rank and job (24 here)
    assert _counted_reads(4, monkeypatch) == 0


def test_a_batch_of_repeat_dones_is_read_without_msgpack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs in flight: a worker's Dones come in batches (mpl.wire.batch), each read as if
    it had come alone, by comparison too."""
    shell = _BatchedShell()
    try:
        shell.hold()
        for _ in range(2):
            shell.batch(None)
        with counted_unpacks(monkeypatch) as reads:
            for _ in range(3):
                shell.batch(None)  # (it checks every answer)
    finally:
        shell.close()
    assert reads[0] == 0  # before: one per Done (48 here)


def test_a_done_for_another_rank_takes_the_full_read_and_is_refused() -> None:
    """Worker 0, its Dones kept for comparison, sends one naming rank 1 for the next job:
    read in full (the rank is among the bytes compared) and dropped (the rank is not its
    own); the job ends only with rank 1's own Done, with rank 1's value."""
    shell = _Shell(2)
    try:
        for _ in range(3):
            shell.job(lambda *_: None)
        shell.jobs += 1
        name = f"j{shell.jobs:05d}"
        ranks = (0, 1)
        exec_msg = Exec(shell.sid, name, shell.graph.digest, ranks, {}, (0,))
        shell.driver.send_multipart(to_wire(encode(exec_msg)))
        w0, w1 = shell.workers
        assert shell._next(w0, Exec).job == name
        assert shell._next(w1, Exec).job == name
        forged = Done(shell.sid, name, 1, {0: 666}, STATS, {0: "int64[]"})
        w0.send_multipart([_one(forged)])
        w0.send_multipart([_one(Done(shell.sid, name, 0, {0: 1}, STATS, {0: "int64[]"}))])
        w1.send_multipart([_one(Done(shell.sid, name, 1, {0: 1}, STATS, {0: "int64[]"}))])
        result = shell._next(shell.driver, JobResult)
        assert result.job == name and result.values == {0: {0: 1, 1: 1}}
    finally:
        shell.close()


def test_one_reader_whose_sender_changes_layouts_reads_every_repeat_as_the_full_read() -> None:
    """One reader, as the broker keeps one per sender, through runs of Dones of one layout
    after another (other sizes, other tails: metas, values, boxes of other lengths): it
    drops a layout, backs off and keeps the next, and every Done it reads by comparison
    reads as the full read reads it. Review w31-rev-perf: the tail's offset is kept with
    the layout since 8e910db; one kept from an earlier layout would cut a later one's
    stats and tail wrongly."""
    rng = random.Random(31)
    reader = RepeatDones(boxes=True)
    layouts: list[Any] = [
        *(
            lambda j, i, shape=shape: _one(
                Done(shape[0], j, shape[1], shape[2], _stats(i), shape[3])
            )
            for shape in _SHAPES
        ),
        lambda j, i: _boxed(j, i),
        lambda j, i: _boxed(j, i, size=75),
        lambda j, i: _one(Done("s" * 34, j, 1, {0: _box(i)}, _stats(i), {0: "int", 3: "x" * 9})),
    ]
    repeats = n = 0
    for _ in range(60):
        make = rng.choice(layouts)
        for _ in range(rng.randrange(1, 40)):
            n += 1
            one = make(f"j{n:016d}", n)
            read = reader.repeat(one)
            if read is None:
                full = read_done_header(one[4:])
                assert full is not None
                reader.keep(one, full)
            else:
                repeats += 1
                assert _fields(read) == _full(one), one
    assert repeats > 300  # most Dones of a run after its first few
