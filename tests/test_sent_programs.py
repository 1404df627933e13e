"""The client's memory of the programs it sent the broker stays bounded.

Every distinct program is a new digest (a secure ``mp.save`` of a new name is one), so a
client that remembered every one would grow for as long as it runs. It keeps the newest
(``mpl.driver.sent_programs``); a program it forgot is sent again before its next job.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import mpl.driver as mp
from mpl.broker.state import PROGRAM_CACHE
from mpl.driver.sent_programs import PROGRAMS_KEPT, SentPrograms
from mpl.wire.graph import Graph, GraphBuilder
from mpl.wire.jobs import Program

WORLD_SIZE = 2


@pytest.fixture
def sim() -> Iterator[Any]:
    ctx = mp.Simulator.simple(WORLD_SIZE)
    yield ctx
    ctx.close()


def _constant(value: int) -> Graph:
    b = GraphBuilder(WORLD_SIZE, name=f"save{value}")  # as a save of a new name: a new program
    return b.build(b.op("constant", [], ranks=(0,), value=value))


def test_a_client_running_ever_new_programs_remembers_at_most_the_brokers_cache(
    sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sim.client
    sent: list[str] = []
    send = client._send

    def counted(msg: Any) -> None:
        if type(msg) is Program:
            sent.append(msg.digest)
        send(msg)

    monkeypatch.setattr(client, "_send", counted)
    first = _constant(0)
    n = PROGRAM_CACHE + 40
    for value in range(n):
        graph = first if value == 0 else _constant(value)
        assert sim.run(graph, {}, inline=(0,)).values == {0: {0: value}}
    assert len(sent) == n  # each sent once
    assert len(client._programs) <= PROGRAM_CACHE
    assert first.digest not in client._programs  # the oldest went first
    # forgotten: sent again before its job, which runs
    assert sim.run(first, {}, inline=(0,)).values == {0: {0: 0}}
    assert sent[-1] == first.digest and len(sent) == n + 1
    assert first.digest in client._programs


def test_the_oldest_sent_goes_first_and_one_sent_again_is_the_newest() -> None:
    programs = SentPrograms(3)
    for digest in "abc":
        programs.add(digest)
    programs.add("a")  # sent again: the newest
    programs.add("d")
    assert list(programs) == ["c", "a", "d"]
    programs.discard("c")
    programs.discard("zz")  # not there: nothing
    assert list(programs) == ["a", "d"] and "a" in programs and "c" not in programs
    assert PROGRAMS_KEPT <= PROGRAM_CACHE  # no larger than what the broker keeps
