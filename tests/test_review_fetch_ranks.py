"""Review (w26): ``mp.fetch`` of a loaded value whose ranks the broker named.

``mp.load`` outside a function builds its Value from the broker's ``SymbolInfo``: the ranks
that hold the name are whatever the broker answered, unchecked against the driver's spec.
``fetch_one`` then fills a list by rank with ``by_rank[rank] = ...`` (8195997), so a rank
outside ``0 .. world - 1`` from a broker that lies (plaintext: nothing seals the answer)
either writes the value fetched "from rank -1" into the last rank's slot (a negative index)
or escapes as an ``IndexError``. Before (209cfaa) the values were gathered by rank in a dict
and read back for ``range(world)``: such a rank never reached a slot. The fake below plays
the broker: it answers the load with the ranks it likes, and each fetch with a value that
says which rank was asked.
"""

from __future__ import annotations

from typing import Any

import pytest

import mpl.driver as mp
import mpl.driver.names as names
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import ProtocolError
from mpl.wire.sessions import SymbolInfo


class _HostileBroker:
    """A plaintext broker's answers, as the driver's client returns them."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self.asked: list[int] = []

    def load_symbol(self, session: str, name: str, **_: Any) -> SymbolInfo:
        return SymbolInfo(name, "", self.ranks, False, {})


class _Context:
    """The driver context ``mp.load`` and ``mp.fetch`` use, its broker the fake above."""

    def __init__(self, broker: _HostileBroker) -> None:
        self.cluster = ClusterSpec.simple(2, enable_spu=False)
        self.client = broker
        self.session = "s"
        self.closed = False

    def fetch_raw(self, rank: int, uri: str, *, timeout: float | None = None) -> Any:
        self.client.asked.append(rank)
        return f"what the broker said rank {rank} holds"


@pytest.mark.xfail(
    strict=True,
    reason="review w26 (low): fetch_one indexes a list by a rank the broker named; "
    "a rank outside the world aliases another rank's slot or raises IndexError",
)
@pytest.mark.parametrize("lied", [(0, -1), (0, 2)], ids=["negative", "past-the-world"])
def test_a_loaded_value_on_ranks_outside_the_world_never_fills_another_ranks_slot(
    monkeypatch: pytest.MonkeyPatch, lied: tuple[int, ...]
) -> None:
    broker = _HostileBroker(lied)
    ctx = _Context(broker)
    monkeypatch.setattr(names, "current", lambda: ctx)
    value = mp.load("x")
    assert value.parties == lied  # as the broker said: nothing checks it on the way
    try:
        got = mp.fetch(value)
    except ProtocolError:
        return  # refusing the broker's ranks is a fine answer too
    # rank 1 holds nothing the driver asked for: its slot stays empty
    assert got == ["what the broker said rank 0 holds", None]
