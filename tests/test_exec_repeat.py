"""The repeat Exec reader (``mpl.wire.exec_repeat``) against the general decode.

It reads a program's next Exec by comparing it with the last one it read in full, so it
must take exactly what ``decode`` takes and build the same record: after a real Exec, the
next one (another job id, of the same length or not) is mutated anywhere, inside the job
id or outside it, and the reader's answer compared with decode's.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import msgpack
import pytest
from helpers import decoded_exec, mutated, sample_execs

import mpl.wire.exec_repeat as exec_repeat
from mpl.wire.codec import MAGIC_FRAME, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.exec_repeat import RepeatExecs
from mpl.wire.hot import read_exec
from mpl.wire.jobs import Exec
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, split_own


def _programs() -> list[Exec]:
    # and a long session with a fixstr job id
    return [*sample_execs(), Exec("s" * 40, "k" * 31, "dig", (0, 1), {}, (0,))]


_NEXT_IDS = ("0123456789abcdef01234567", "x", "é" * 3, "y" * 40, "z" * 300)


def _frames(exe: Exec) -> list[bytes]:
    return [bytes(f) for f in encode(exe)]


def _same(a: Exec, b: Exec | None) -> bool:
    return a == b and all(getattr(a, f) == getattr(b, f) for f in a.__dataclass_fields__)


def _reader_after(first: Exec) -> RepeatExecs:
    reader = RepeatExecs()
    read = reader.read(_frames(first))
    assert read is None or _same(read, decoded_exec(_frames(first)))
    return reader


def test_a_repeat_is_read_by_comparison_as_decode_reads_it() -> None:
    for first in _programs():
        reader = _reader_after(first)
        remembered = reader.full_reads == 1
        for job in _NEXT_IDS:
            nxt = dataclasses.replace(first, job=job)
            read = reader.read(_frames(nxt))
            if remembered:
                assert read is not None and _same(read, nxt)
                assert _same(read, decoded_exec(_frames(nxt)))
            else:  # decode's to read, every time
                assert read is None and read_exec(_frames(nxt)) is None
        if remembered:  # every next one by comparison: no full read
            assert reader.repeats == len(_NEXT_IDS) and reader.full_reads == 1
    # a record in the bindings (a Lit) is decode's to read: nothing to compare with
    assert _reader_after(_programs()[4]).full_reads == 0


def _against_decode(reader: RepeatExecs, header: bytes) -> str:
    """Read ``header`` with ``reader`` and check it against ``decode``: "taken" (read as
    decode reads it), "refused" (by both) or "left" (to decode, as read_exec leaves it)."""
    frames = [MAGIC_FRAME, header]
    before = reader.repeats
    read, want = reader.read(frames), decoded_exec(frames)
    if want is None:
        assert read is None, f"took what decode refuses: {header!r}"
        return "refused"
    if read is not None:
        assert _same(read, want), f"read {read!r}, decode {want!r}: {header!r}"
        return "taken"
    assert reader.repeats == before and read_exec(frames) is None
    return "left"


def test_every_mutated_repeat_is_taken_exactly_when_decode_takes_it() -> None:
    rng = random.Random(715)
    taken = refused = repeats = 0
    for first in _programs():
        for job in ("job-9", "ab", "q" * 33):
            header = _frames(dataclasses.replace(first, job=job))[1]
            start = header.index(job.encode())  # mutations inside the job id too, often
            for n in range(400):
                reader = _reader_after(first)
                before = reader.repeats
                if n % 2:
                    bad = mutated(header, rng)
                else:  # within the job id and the byte before it (its str header)
                    at = rng.randrange(start - 1, start + len(job))
                    bad = header[:at] + bytes([rng.randrange(256)]) + header[at + 1 :]
                outcome = _against_decode(reader, bad)
                repeats += reader.repeats - before
                taken += outcome == "taken"
                refused += outcome == "refused"
    assert taken > 500 and refused > 500 and repeats > 500


def test_a_repeat_said_by_its_job_id_is_the_repeat_read_as_a_record() -> None:
    """``repeat_job`` (the worker's plaintext path) takes exactly the messages ``repeat``
    takes, saying each by the job id of the record ``repeat`` reads; ``last`` with that id
    (``record``) is that record. It never takes a sealed repeat (that is ``repeat``'s)."""
    rng = random.Random(716)
    taken = 0
    for first in _programs():
        header = _frames(dataclasses.replace(first, job="job-9"))[1]
        for n in range(300):
            by_record, by_id = _reader_after(first), _reader_after(first)
            frames = [MAGIC_FRAME, header if n == 0 else mutated(header, rng)]
            record, job = by_record.repeat(frames), by_id.repeat_job(frames)
            if record is None:
                assert job is None and by_id.repeats == 0
                continue
            taken += 1
            assert job == record.job and by_id.repeats == 1
            assert by_id.last is not None and _same(by_id.last, first)
            assert _same(by_id.record(job), record)
            assert by_id.record(job).bindings is not by_id.last.bindings
    assert taken > 20
    sealed = Exec("s", "j1", "dig", (0, 1), {1: b"box-1" * 20}, (0,))
    reader = _reader_after(sealed)
    nxt = _frames(dataclasses.replace(sealed, job="j2"))
    assert reader.repeat_job(nxt) is None and reader.repeat(nxt) is not None


def test_a_repeat_in_the_frame_as_received_is_the_repeat_said_by_its_job_id() -> None:
    """``repeat_frame`` (the worker's plaintext path for a message of one frame, wire v4)
    takes exactly the messages ``repeat_job`` takes, saying the same job id: mutated
    anywhere, the magic too, and with job ids of other lengths. Never a sealed repeat."""
    rng = random.Random(717)
    taken = 0
    for first in _programs():
        for job in ("job-9", "ab", "q" * 33, "é" * 3):
            whole = b"".join(_frames(dataclasses.replace(first, job=job)))
            for n in range(200):
                by_frames, by_frame = _reader_after(first), _reader_after(first)
                data = whole if n == 0 else mutated(whole, rng)
                want = by_frames.repeat_job([data[:4], data[4:]])
                assert by_frame.repeat_frame(data) == want, data
                assert by_frame.repeats == by_frames.repeats
                taken += want is not None
    assert taken > 100
    sealed = Exec("s", "j1", "dig", (0, 1), {1: b"box-1" * 20}, (0,))
    reader = _reader_after(sealed)
    nxt = b"".join(_frames(dataclasses.replace(sealed, job="j2")))
    assert reader.repeat_frame(nxt) is None and reader.repeat([nxt[:4], nxt[4:]]) is not None
    assert RepeatExecs().repeat_frame(nxt) is None  # nothing remembered: nothing taken


def test_a_refused_message_leaves_the_last_accepted_header_to_compare_with() -> None:
    first = _programs()[0]
    reader = _reader_after(first)
    header = _frames(dataclasses.replace(first, job="job-2"))[1]
    at = header.index(b"job-2")
    broken = header[:at] + b"\xff" + header[at + 1 :]  # not UTF-8: decode refuses it
    assert decoded_exec([MAGIC_FRAME, broken]) is None
    assert reader.read([MAGIC_FRAME, broken]) is None
    assert reader.read([b"not the magic", header]) is None
    assert reader.read([object(), header]) is None  # no buffer: refused, as read_exec does
    assert read_exec([object(), header]) is None
    read = reader.read([MAGIC_FRAME, header])
    assert read is not None and read.job == "job-2" and reader.repeats == 1


def test_a_record_read_by_comparison_shares_no_mutable_map(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _programs()[3]
    reader = _reader_after(first)
    a = reader.read(_frames(dataclasses.replace(first, job="a")))
    b = reader.read(_frames(dataclasses.replace(first, job="b")))
    assert a is not None and b is not None and reader.repeats == 2
    assert a.bindings == b.bindings and a.bindings is not b.bindings

    def no_full_read(frames: Any) -> None:
        raise AssertionError("a repeat was read in full")

    monkeypatch.setattr(exec_repeat, "read_exec", no_full_read)
    assert reader.read(_frames(dataclasses.replace(first, job="c"))) is not None


def test_bindings_sealed_for_two_ranks_are_not_kept_to_compare_with() -> None:
    """A worker gets its own box alone (the broker cuts the rest): two are decode's."""
    sealed = Exec("s", "j1", "dig", (0, 1), {0: b"box-0", 1: b"box-1"}, (0,))
    reader = RepeatExecs()
    assert reader.read(_frames(sealed)) == sealed
    again = reader.read(_frames(dataclasses.replace(sealed, job="j2")))
    assert again is not None and again.job == "j2"
    assert reader.repeats == 0 and reader.full_reads == 2


def _box(n: int, size: int = 67) -> bytes:
    """A stand-in for a sealed box (secure mode): its magic, then bytes that change."""
    return (b"mpl-box\x01" + n.to_bytes(4, "big") * 64)[:size]


_SEALED = (
    Exec("sf4bfebd7609bd99a", "e82a3afbbbad89c9a1eb7dbf", "d" * 32, (0,), {0: _box(0)}, (0,), 600),
    Exec("s", "j-1", "dig", (0, 1), {1: _box(0, 300)}, (), 2.5),  # a bin16 box
)


def test_a_sealed_repeat_is_read_by_comparison_outside_its_job_id_and_box() -> None:
    """Secure mode: every job's box is new, the rest of its header the last one's."""
    for first in _SEALED:
        reader = _reader_after(first)
        assert reader.full_reads == 1
        rank = next(iter(first.bindings))
        for n in range(1, 6):
            job = first.job[:-1] + str(n)  # as long as the last: the driver's job ids are
            nxt = dataclasses.replace(
                first, job=job, bindings={rank: _box(n, len(first.bindings[rank]))}
            )
            read = reader.read(_frames(nxt))
            assert read is not None and _same(read, nxt)
            assert _same(read, decoded_exec(_frames(nxt)))
        assert reader.repeats == 5 and reader.full_reads == 1
        # a box of another size, or another job id's length: read in full, then kept anew
        for changed in (
            dataclasses.replace(first, job="other", bindings={rank: _box(9, 40)}),
            dataclasses.replace(first, job=first.job + "x"),
        ):
            read = reader.read(_frames(changed))
            assert read is not None and _same(read, changed)
        assert reader.repeats == 5 and reader.full_reads == 3


def test_every_mutated_sealed_repeat_is_taken_exactly_when_decode_takes_it() -> None:
    rng = random.Random(919)
    taken = refused = repeats = 0
    for first in _SEALED:
        rank = next(iter(first.bindings))
        box = _box(7, len(first.bindings[rank]))
        job = first.job[:-1] + "7"
        header = _frames(dataclasses.replace(first, job=job, bindings={rank: box}))[1]
        spans = (header.index(job.encode()) - 1, header.index(box) - 3)  # and their headers
        for n in range(600):
            reader = _reader_after(first)
            before = reader.repeats
            if n % 3 == 0:
                bad = mutated(header, rng)
            else:  # within the job id or the box, or the bytes just before them
                start = spans[n % 3 - 1]
                at = rng.randrange(start, start + 12)
                bad = header[:at] + bytes([rng.randrange(256)]) + header[at + 1 :]
            outcome = _against_decode(reader, bad)
            repeats += reader.repeats - before
            taken += outcome == "taken"
            refused += outcome == "refused"
    assert taken > 500 and refused > 100 and repeats > 500


def _sealed(exe: Exec, box: bytes) -> bytes:
    """A rank's sealed Exec frame (``mpl.wire.sealed_exec``): the header, then its box."""
    packed: bytes = msgpack.packb(box)
    return bytes(encode(exe)[1]) + packed


def test_a_sealed_repeat_is_read_only_as_the_full_read_reads_it() -> None:
    """A secure Exec's frame (its header, bindings empty, then one box) read by comparison
    (``repeat_sealed``), next to the full read (``split_own``, then ``decode``) on mutated
    frames: whatever the comparison takes, the full read takes too, as the same job and box
    (and it takes the genuine next ones)."""
    rng = random.Random(11)
    first = Exec("s" * 16, "j" * 24, "d" * 64, (0, 1), {}, (0,), 5.0)
    reader = RepeatExecs()
    header, box = split_own(_sealed(first, b"b" * 70))
    assert reader.read_in_full([MAGIC_FRAME, header]) is not None
    for size in (70, 300):  # a bin8 box and a bin16 one
        genuine = _sealed(dataclasses.replace(first, job="k" * 24), b"\x01" * size)
        assert reader.repeat_sealed(genuine) == ("k" * 24, b"\x01" * size)
        for _ in range(2000):
            data = mutated(genuine, rng)
            said = reader.repeat_sealed(data)
            if said is None:
                continue
            try:
                header, box = split_own(data)
            except ProtocolError:
                raise AssertionError(f"a repeat the full read refuses: {data!r}") from None
            assert box == said[1]
            assert decoded_exec([MAGIC_FRAME, header]) == dataclasses.replace(first, job=said[0])


def test_a_sealed_repeat_frame_is_read_only_as_the_full_read_reads_it() -> None:
    """The same, for the frame as the worker receives it (``repeat_sealed_frame``: the
    magic, the header and the box in one frame), mutated magic and all: whatever the
    comparison takes is a sealed Exec (its magic) that the full read takes too, as the same
    job and box; and it says what ``repeat_sealed`` says of the frame without its magic."""
    assert exec_repeat._SEALED_MAGIC == SEALED_EXEC_MAGIC  # (kept apart: an import cycle)
    rng = random.Random(12)
    first = Exec("s" * 16, "j" * 24, "d" * 64, (0, 1), {}, (0,), 5.0)
    reader = RepeatExecs()
    header, _ = split_own(_sealed(first, b"b" * 70))
    assert reader.read_in_full([MAGIC_FRAME, header]) is not None
    taken = 0
    for size in (70, 300):  # a bin8 box and a bin16 one
        genuine = SEALED_EXEC_MAGIC + _sealed(
            dataclasses.replace(first, job="k" * 24), b"\x01" * size
        )
        assert reader.repeat_sealed_frame(genuine) == ("k" * 24, b"\x01" * size)
        for _ in range(2000):
            data = mutated(genuine, rng)
            said = reader.repeat_sealed_frame(data)
            if data[:4] == SEALED_EXEC_MAGIC:
                assert said == reader.repeat_sealed(data[4:])
            if said is None:
                continue
            taken += 1
            assert data[:4] == SEALED_EXEC_MAGIC, f"a repeat without the magic: {data!r}"
            try:
                header, box = split_own(data[4:])
            except ProtocolError:
                raise AssertionError(f"a repeat the full read refuses: {data!r}") from None
            assert box == said[1]
            assert decoded_exec([MAGIC_FRAME, header]) == dataclasses.replace(first, job=said[0])
    assert taken > 100


def test_no_sealed_repeat_frame_after_a_plain_exec_with_bindings() -> None:
    # as below, for the frame as received: a header remembered with bindings keeps none
    execs = RepeatExecs()
    first = bytes(encode(Exec("s", "job-0001", "d", (0,), {0: ["mpl://x"]}, (0,), 0.0))[1])
    assert execs.read_in_full([MAGIC_FRAME, first]) is not None  # remembered
    again = bytes(encode(Exec("s", "job-0002", "d", (0,), {0: ["mpl://x"]}, (0,), 0.0))[1])
    assert execs.repeat_sealed_frame(SEALED_EXEC_MAGIC + again + msgpack.packb(b"b" * 20)) is None
    bare = bytes(encode(Exec("s", "job-0003", "d", (0,), {}, (0,), 0.0))[1])
    assert execs.read_in_full([MAGIC_FRAME, bare]) is not None  # remembered, no bindings
    plain_magic = MAGIC_FRAME + bare.replace(b"job-0003", b"job-0004") + msgpack.packb(b"b" * 20)
    assert execs.repeat_sealed_frame(plain_magic) is None  # a plaintext magic: not sealed
    assert execs.repeat_sealed_frame(SEALED_EXEC_MAGIC + plain_magic[4:]) == (
        "job-0004",
        b"b" * 20,
    )


def test_a_sealed_repeat_is_not_read_after_a_plain_exec_with_bindings() -> None:
    # a hostile broker sends a plain Exec with bindings (remembered as it is read in full),
    # then the sealed shape with that header and a box: the full read refuses a sealed
    # Exec whose header carries bindings, so the comparison read must not take it
    execs = RepeatExecs()
    first = bytes(encode(Exec("s", "job-0001", "d", (0,), {0: ["mpl://x"]}, (0,), 0.0))[1])
    assert execs.read_in_full([MAGIC_FRAME, first]) is not None  # remembered
    again = bytes(encode(Exec("s", "job-0002", "d", (0,), {0: ["mpl://x"]}, (0,), 0.0))[1])
    assert execs.repeat_sealed(again + msgpack.packb(b"box" * 20)) is None
