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

import pytest
from helpers import decoded_exec, mutated, sample_execs

import mpl.wire.exec_repeat as exec_repeat
from mpl.wire.codec import MAGIC_FRAME, encode
from mpl.wire.exec_repeat import RepeatExecs
from mpl.wire.jobs import Exec


def _programs() -> list[Exec]:
    # and a long session with a fixstr job id
    return [*sample_execs(), Exec("s" * 40, "k" * 31, "dig", (0, 1), {}, (0,))]


_NEXT_IDS = ("0123456789abcdef01234567", "x", "é" * 3, "y" * 40, "z" * 300)


def _frames(exe: Exec) -> list[bytes]:
    return [bytes(f) for f in encode(exe)]


def _same(a: Exec, b: Exec) -> bool:
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
                assert read is None and exec_repeat.read_exec(_frames(nxt)) is None
        if remembered:  # every next one by comparison: no full read
            assert reader.repeats == len(_NEXT_IDS) and reader.full_reads == 1
    # a record in the bindings (a Lit) is decode's to read: nothing to compare with
    assert _reader_after(_programs()[4]).full_reads == 0


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
                frames = [MAGIC_FRAME, bad]
                read, want = reader.read(frames), decoded_exec(frames)
                repeats += reader.repeats - before
                if want is None:
                    assert read is None, f"took what decode refuses: {bad!r}"
                    refused += 1
                elif read is not None:
                    assert _same(read, want), f"read {read!r}, decode {want!r}: {bad!r}"
                    taken += 1
                else:  # left to decode: only what read_exec leaves to it too
                    assert reader.repeats == before and exec_repeat.read_exec(frames) is None
    assert taken > 500 and refused > 500 and repeats > 500


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
    assert exec_repeat.read_exec([object(), header]) is None
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


def test_sealed_bindings_are_not_kept_to_compare_with() -> None:
    """Sealed afresh for every job (secure mode), they never repeat: not worth keeping."""
    sealed = Exec("s", "j1", "dig", (0, 1), {0: b"box-0", 1: b"box-1"}, (0,))
    reader = RepeatExecs()
    assert reader.read(_frames(sealed)) == sealed
    again = reader.read(_frames(dataclasses.replace(sealed, job="j2")))
    assert again is not None and again.job == "j2"
    assert reader.repeats == 0 and reader.full_reads == 2
