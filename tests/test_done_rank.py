"""Is a worker's sealed Done bound to its rank? Its context (``done|session|job|index``)
names no rank; the driver opens each rank's box only as sealed by that rank's node
(``mpl.wire.result_open``: the sender's key, by the box's epoch or by ``Sealer.open``).
A worker is one rank and one node key, so the sender pins the rank as long as the driver
never has one node at two ranks: a box moved to another rank's slot, or replayed there,
does not open. The driver's layout keeps a node at one rank across sessions
(``DriverSeal.bind``), which a broker's layout could once break by naming a known node at
a rank the driver had no node for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from test_seal_counts import _driver_and_nodes

from mpl.driver.sealing import DriverSeal
from mpl.wire.errors import AuthenticationError
from mpl.wire.jobs import Done, Exec
from mpl.worker.sealing import WorkerSeal


def _boxes(driver: DriverSeal, workers: list[WorkerSeal], job: str) -> dict[int, Any]:
    """Each rank's sealed output 0 of a 2p job ``job`` of session "s" (rank r answers
    ``f"rank {r}'s value"``), as the broker hands them on."""
    msg = driver.exec(Exec("s", job, "d", (0, 1), {}, (0,), 5.0))
    boxes: dict[int, Any] = {}
    for rank, worker in enumerate(workers):
        one = Exec("s", job, "d", (0, 1), {rank: msg.bindings[rank]}, (0,), 5.0)
        assert worker.inbound(one)[1] is None
        done = worker.outbound(Done("s", job, rank, {0: f"rank {rank}'s value"}))
        assert isinstance(done, Done)
        boxes[rank] = done.values[0]
    return boxes


@pytest.mark.parametrize("known", [False, True])
def test_a_ranks_sealed_value_does_not_open_as_another_ranks(known: bool) -> None:
    """The broker swaps the two ranks' boxes of one job's output, or hands rank 0's box in
    both slots: the driver refuses each (by ``Sealer.open`` for a first box of an epoch,
    ``known``: by the epoch's head, the sender checked first)."""
    driver, workers = _driver_and_nodes()
    if known:  # an honest answer first: both nodes' epochs known to the opener
        honest = _boxes(driver, workers, "j0")
        opened = driver.opened("s", "j0", {0: dict(honest)})
        assert opened == {0: {0: "rank 0's value", 1: "rank 1's value"}}
    for forged, order in (("swapped", (1, 0)), ("replayed", (0, 0))):
        boxes = _boxes(driver, workers, f"j-{forged}")
        slots = {rank: boxes[source] for rank, source in enumerate(order)}
        with pytest.raises(AuthenticationError):
            driver.opened("s", f"j-{forged}", {0: slots})
    boxes = _boxes(driver, workers, "j-last")  # nothing learnt from the forgeries
    assert driver.opened("s", "j-last", {0: boxes}) == {
        0: {0: "rank 0's value", 1: "rank 1's value"}
    }


def test_a_layout_never_puts_a_known_node_at_a_second_rank() -> None:
    """A session's layout names n0 at rank 0; a later one (the broker's word) names n0 at
    rank 1 and some other node, not of this driver's spec, at rank 0: the driver would seal
    rank 1's bindings for n0 and open n0's boxes as rank 1's (rank 0's value delivered as
    rank 1's). Refused: a node's rank never changes on one broker."""
    driver, workers = _driver_and_nodes()
    spec = SimpleNamespace(nodes=[SimpleNamespace(name="n0")])
    alone = DriverSeal(driver.sealer, SimpleNamespace(cluster=spec), trusted=False)  # type: ignore[arg-type]
    first = SimpleNamespace(nodes=[SimpleNamespace(name="n0", rank=0)])
    alone.bind(first)  # type: ignore[arg-type]
    moved = SimpleNamespace(
        nodes=[SimpleNamespace(name="other", rank=0), SimpleNamespace(name="n0", rank=1)]
    )
    refusal = ""
    try:
        alone.bind(moved)  # type: ignore[arg-type]
    except AuthenticationError as exc:
        refusal = str(exc)
    else:  # what it then took: n0's value (rank 0's) as rank 1's
        msg = alone.exec(Exec("s", "j", "d", (0,), {}, (0,), 5.0))
        one = Exec("s", "j", "d", (0,), {0: msg.bindings[0]}, (0,), 5.0)
        assert workers[0].inbound(one)[1] is None
        done = workers[0].outbound(Done("s", "j", 0, {0: "rank 0's value"}))
        assert isinstance(done, Done)
        taken = alone.opened("s", "j", {0: {1: done.values[0]}})
        raise AssertionError(f"n0 at ranks 0 and 1: rank 1's value read as {taken[0][1]!r}")
    assert "node's rank never changes" in refusal
    with pytest.raises(AuthenticationError):
        alone._node(1)  # no node taken for rank 1
    alone.bind(first)  # type: ignore[arg-type]  # the same layout again: fine
