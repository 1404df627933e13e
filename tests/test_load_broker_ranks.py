"""``mp.load`` checks the ranks the broker names for a value (found in review, w26).

``mp.load`` outside a function builds its Value from the broker's ``SymbolInfo``: the ranks
that hold the name are whatever the broker answered, unchecked against the driver's spec.
``fetch_one`` then fills a list by rank with ``by_rank[rank] = ...`` (8195997), so a rank
outside ``0 .. world - 1`` from a broker that lies (plaintext: nothing seals the answer)
either writes the value fetched "from rank -1" into the last rank's slot (a negative index)
or escapes as an ``IndexError``. Before (209cfaa) the values were gathered by rank in a dict
and read back for ``range(world)``: such a rank never reached a slot. Now the driver checks
the ranks when the broker names them. The fake below plays the broker: it answers the load
with the ranks it likes, and each fetch with a value that says which rank was asked.
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


@pytest.mark.parametrize(
    "lied", [(0, -1), (0, 2), (1, 1), ()], ids=["negative", "past-the-world", "twice", "none"]
)
def test_a_load_whose_ranks_are_not_this_clusters_is_refused(
    monkeypatch: pytest.MonkeyPatch, lied: tuple[int, ...]
) -> None:
    """The driver checks the ranks the broker names for a loaded value when it gets them:
    nothing is fetched from a rank outside the world, and no slot of the fetch is filled
    from one."""
    broker = _HostileBroker(lied)
    ctx = _Context(broker)
    monkeypatch.setattr(names, "current", lambda: ctx)
    with pytest.raises(ProtocolError, match="held by ranks"):
        mp.load("x")
    assert broker.asked == []


def test_a_load_on_the_clusters_ranks_is_fetched_by_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _HostileBroker((1, 0))
    ctx = _Context(broker)
    monkeypatch.setattr(names, "current", lambda: ctx)
    assert mp.fetch(mp.load("x")) == [
        "what the broker said rank 0 holds",
        "what the broker said rank 1 holds",
    ]
