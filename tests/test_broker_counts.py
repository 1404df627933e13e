"""What the broker does per job and per rank, counted: calls, objects and sends.

The broker's CPU per job is mostly per message and per rank; these tests pin the structural
cuts by counting what a trivial job costs (never by timing it). Each is checked on the
real readers and a real ``Broker`` whose ROUTER is swapped for a recorder after start-up,
fed the frames a driver and its workers send.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from mpl.wire import hot
from mpl.wire.codec import MAGIC_FRAME, encode
from mpl.wire.jobs import Done, Exec
from mpl.wire.limits import MAX_NESTING

# What a worker's stats look like for a trivial job (mpl.worker.jobs)
STATS = {"run_s": 1.2e-05, "started": 1.7645e9, "ops": [[0, "pcall", 1e-06, 1.1e-05]]}


@pytest.fixture
def nesting_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the readers' walks over a message's containers (check_nesting)."""
    walks: list[int] = []
    real = hot.check_nesting

    def counted(items: Any) -> None:
        walks.append(1)
        real(items)

    monkeypatch.setattr(hot, "check_nesting", counted)
    return walks


def test_a_hot_done_is_not_walked_for_nesting_its_bytes_cannot_reach(
    nesting_walks: list[int],
) -> None:
    """A Done's fields are each too short to nest 100 deep: read without the walk."""
    frames = encode(Done("s" * 16, "j" * 24, 1, {0: 1, 1: [1.5, "x"]}, STATS, {0: "int64[]"}))
    assert len(frames[1]) >= MAX_NESTING  # long enough that the header alone bounds nothing
    assert hot.read_done(frames) is not None
    assert nesting_walks == []


def test_a_done_whose_value_could_nest_deep_is_still_walked_and_refused(
    nesting_walks: list[int],
) -> None:
    pack = msgpack.packb
    head = b"".join((b"\x98", pack("done"), pack("s"), pack("j"), pack(0)))
    deep = b"\x91" * 98 + b"\x90"  # 99 levels inside the values map: past MAX_NESTING
    assert hot.read_done([MAGIC_FRAME, head + b"\x81\x00" + deep + b"\x80\x80\x90"]) is None
    fine = b"\x91" * 40 + b"\x90"  # a long value (41 bytes) that nests 41 levels: walked
    stats = pack({"k": "x" * 120})  # and a long stats map
    read = hot.read_done([MAGIC_FRAME, head + b"\x81\x00" + fine + stats + b"\x80\x90"])
    assert read is not None
    assert len(nesting_walks) == 2


def test_an_exec_without_bindings_is_not_walked_for_nesting(nesting_walks: list[int]) -> None:
    """Ranks and outputs are tuples (bounded on their own): only bindings can nest."""
    frames = encode(Exec("s" * 16, "j" * 24, "d" * 64, (0, 1), {}, (0,), 600.0))
    assert len(frames[1]) >= MAX_NESTING
    assert hot.read_exec(frames) is not None
    assert nesting_walks == []
    bound = encode(Exec("s" * 16, "j" * 24, "d" * 64, (0, 1), {0: [[[1]]]}, (0,), 600.0))
    assert hot.read_exec(bound) is not None
    assert nesting_walks == [1]
