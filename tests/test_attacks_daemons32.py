"""Closed findings, their attacks sent through real daemons (w32-trust).

Their first tests drove the pure cores or forged frames into the decoder; here each attack
goes over sockets to real ``mpl-worker`` processes (and a secure broker in this process
behind a tap, the ``Rig`` of ``test_replay_restart``, or an ``mpl-broker`` process), and
each test checks that the daemons refuse it and still serve:

- a driver's own job tells another driver's persisted name from a free one on a worker
  (w31's leftover: the worker's read check answered "belongs to another driver");
- R2/B1/B2: Arrow tables whose rows or items take no bytes, nested dictionaries, and numpy
  dtypes of size 0, sent to a real worker as a peer's move and in a job's inputs;
- B5: a persisted name listed only to its owner, through a real secure broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_replay_restart import Rig, two_workers

import mpl.driver as mp
from mpl.wire import GraphBuilder

pytestmark = pytest.mark.daemons


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster of two real workers listing the analyst and mallory (another
    organisation's driver, or the broker operator's)."""
    yield from two_workers(tmp_path, ("analyst", "mallory"))


def _answer(run: Any, name: str) -> tuple[Any, ...]:
    """What a job that ``run(name)`` runs answers: None, or its error's every field the
    driver sees (the job's own id left out), with ``name`` blanked."""
    try:
        run(name)
    except mp.MplError as exc:
        fields = (
            type(exc).__name__,
            getattr(exc, "remote_type", ""),
            str(exc),
            getattr(exc, "remote_message", ""),
            getattr(exc, "remote_traceback", ""),
            getattr(exc, "op", ""),
            getattr(exc, "rank", None),
        )
        job = getattr(exc, "job", "") or "\0"
        return tuple(
            f.replace(job, "<job>").replace(name, "<name>") if isinstance(f, str) else f
            for f in fields
        )
    return (None,)


def test_a_drivers_job_cannot_tell_another_drivers_persisted_name_from_a_free_one(
    rig: Rig,
) -> None:
    """mallory's own sealed jobs on P0: a ``load`` op and an ``unsave`` op (``mp.delete``'s
    sealed half) of the analyst's persisted ``payroll`` and of ``payrolx``, which no one
    persisted. Before: the load said the value "belongs to another driver" (the free
    name: "no value named"), and the unsave was refused (the free name's deleted nothing
    and succeeded), so mallory confirmed a guessed name. Now each pair answers alike,
    apart from the name, tracebacks included; the analyst's value stays whole."""
    with rig.connect() as analyst, rig.connect("mallory") as mallory:
        with analyst:
            mp.save(mp.put("P0", np.arange(3.0)), "payroll", persist=True)
        with mallory:

            def load(name: str) -> Any:
                @mp.function
                def peek() -> Any:
                    return mp.device("P0")(lambda v: v)(mp.load(name, parties="P0"))

                return mp.fetch(peek())

            def unsave(name: str) -> None:
                b = GraphBuilder(2, name="delete")
                b.op("unsave", [], ranks=(0,), nout=0, symbol=name)
                mallory.run(b.build([]), {})

            for run in (load, unsave):
                taken, free = _answer(run, "payroll"), _answer(run, "payrolx")
                assert taken == free, (run.__name__, taken, free)
            refused = _answer(load, "payrolx")  # a failed load op, on P0, naming no owner
            assert "(load '<name>')" in refused[-2] and refused[-1] == 0, refused
            assert "no value named '<name>'" in refused[2], refused
            assert _answer(unsave, "payrolx") == (None,)  # nothing of mallory's to delete
        with analyst:
            assert mp.fetch(mp.load("payroll", parties=0)).tolist() == [0.0, 1.0, 2.0]
