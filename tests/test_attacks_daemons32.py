"""Closed findings, their attacks sent through real daemons (w32-trust).

Their first tests drove the pure cores or forged frames into the decoder; here each attack
goes over sockets to real ``mpl-worker`` processes (and a secure broker in this process
behind a tap, the ``Rig`` of ``test_replay_restart``, or an ``mpl-broker`` process), and
each test checks that the daemons refuse it and still serve:

- a driver's own job tells another driver's persisted name from a free one on a worker
  (w31's leftover: the worker's read check answered "belongs to another driver");
- R2/B1/B2: Arrow tables whose rows or items take no bytes, nested dictionaries, and numpy
  dtypes of size 0, sent to a real worker as a peer's move and in a job's inputs;
- B5: a persisted name listed only to its owner, through a real secure broker;
- R4: another driver's save, delete or load of an owned name in another case, on real
  workers whose disk folds case (simulated: this machine's file systems do not);
- a persisted name a Done reports after its job ended, its owner's (w31's leftover: no
  one's until the worker registered again).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from helpers import boom, double, nap, stats, wait_until
from test_replay_restart import Rig, two_workers

import mpl.driver as mp
from mpl.wire import GraphBuilder
from mpl.wire.codec import decode, encode, to_wire
from mpl.wire.data import Move
from mpl.wire.decoder import ARRAY
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Abort, Done

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


# -- R2, B1, B2: values that decode to far more than their bytes, to a real worker ----------


def _swapped_array(frames: list[Any], descr: Any, shape: list[int], buffer: bytes) -> list[Any]:
    """``frames`` of a message holding one numpy array, its dtype, shape and buffer swapped
    as a hostile sender writes them (the ARRAY extension's payload is [descr, shape,
    index])."""
    header = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)

    def swap(item: Any) -> Any:
        if isinstance(item, msgpack.ExtType) and item.code == ARRAY:
            return msgpack.ExtType(ARRAY, msgpack.packb([descr, shape, 0]))
        if isinstance(item, list):
            return [swap(x) for x in item]
        return item

    return [frames[0], msgpack.packb(swap(header)), buffer]


def _bombs(sid: str) -> dict[str, list[Any]]:
    """A peer's Move to rank 1 of each value: its frames as a hostile party sends them."""
    pa = pytest.importorskip("pyarrow")
    from test_red31_table_bomb import _bombs as tables
    from test_red31_table_bomb import _stream
    from test_red31b_empty_dtypes import _HIDDEN
    from test_red31b_table_items import _items_naming_one_string

    def table_move(stream: Any) -> list[Any]:
        frames = list(encode(Move(sid, "j", 0, 0, 0, 1, [pa.table({"a": [1.0]})]), safe=True))
        frames[-1] = stream  # an ordinary table's frames, its stream swapped
        return frames

    array = list(encode(Move(sid, "j", 0, 0, 0, 1, [np.zeros(1)]), safe=True))
    return {
        "R2 null rows": table_move(_stream(tables()["null column"])),
        "R2 run-end rows": table_move(_stream(tables()["run-end encoded"])),
        "B1 list items of one dictionary value": table_move(
            _stream(_items_naming_one_string(200, 1 << 20))
        ),
        "B2 V0 items": _swapped_array(array, "|V0", [1 << 40], b""),
        "B2 S0 items": _swapped_array(array, "|S0", [1 << 40], b""),
        "B2 U0 items": _swapped_array(array, "<U0", [1 << 40], b""),
        "B2 a field of no bytes in a struct": _swapped_array(array, _HIDDEN, [4], bytes(32)),
    }


# why each is refused (the worker logs its first refusal only): R2's two, B1, B2's four
_REASONS = {"more than its bytes hold": 2, "name one value": 1, "takes no bytes": 4}


def test_each_forged_move_is_refused_for_its_own_reason() -> None:
    """What the real worker below is sent, each refused by the decoder for the finding it
    carries, not for another bound (so the count below fails with any one fix reverted)."""
    reasons: list[str] = []
    for frames in _bombs("s").values():
        with pytest.raises(ProtocolError) as refused:
            decode(frames, safe=True)
        reasons += [r for r in _REASONS if r in str(refused.value)]
    assert {r: reasons.count(r) for r in _REASONS} == _REASONS


def test_values_bigger_than_their_bytes_sent_to_a_real_worker_are_refused(
    make_cluster: Any,
) -> None:
    """A party's worker (here a raw PUSH on rank 1's data port, as anyone reaching it in
    plaintext) moves to rank 1 an Arrow table of rows taking no bytes (R2), of list items
    naming one 1 MiB dictionary value (B1, 210 MB once built) and arrays of 2**48 items
    of size 0 (B2). Each is refused by the real worker's decoder and counted; the worker
    still runs a job taking a peer's move."""
    cluster = make_cluster("tcp")
    client = cluster.client()
    sid = client.open_session().session
    log = (cluster.impl.run_dir / "worker1.log").read_text()
    data_addr = log.split(" data ", 1)[1].split(",", 1)[0]
    before = stats(client, 1).get("protocol_errors", 0)
    bombs = _bombs(sid)
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        peer = ctx.socket(zmq.PUSH)
        peer.linger = 2000
        peer.connect(data_addr)
        for frames in bombs.values():
            peer.send_multipart(to_wire(frames), copy=False)
        peer.close()
    finally:
        ctx.term()
    wait_until(
        lambda: stats(client, 1).get("protocol_errors", 0) >= before + len(bombs),
        30,
        "rank 1 to refuse every one",
    )
    assert stats(client, 1)["state"] == "up"
    b = GraphBuilder(2)
    x = b.op("pcall", [], ranks=(0,), fn=b.fn(double), args=(21,))[0]
    y = b.op("shuffle", [x], ranks=(0, 1), routing={1: 0})[0]
    assert client.submit(sid, b.build([y]), {}, inline=(0,), timeout=10).values[0] == {1: 42}


# -- B5: persisted names listed to their owner alone, through a real secure broker -----------


def test_a_real_secure_broker_lists_a_persisted_name_to_its_owner_alone(rig: Rig) -> None:
    """The analyst persists ``payroll`` on P0 and mallory ``mine`` on P1, through a real
    secure broker and real workers: each driver's ``mp.symbols()`` and status list its own
    name only, and a load of the other's answers as a name no one has (before B5 every
    listed driver saw every persisted name, with its parties and type). After P0 restarts
    (its hello reports its files' owners), the same."""

    def names(ctx: mp.Context) -> tuple[list[str], list[str]]:
        with ctx:
            listed = sorted(row["name"] for row in mp.symbols()["persisted"])
            return listed, sorted(ctx.status()["persisted_symbols"])

    def check(analyst: mp.Context, mallory: mp.Context) -> None:
        assert names(analyst) == (["payroll"], ["payroll"])
        assert names(mallory) == (["mine"], ["mine"])
        with mallory, pytest.raises(mp.SessionError) as refused:
            mp.load("payroll")
        assert "payroll" in str(refused.value) and "P0" not in str(refused.value)
        with analyst:
            assert mp.fetch(mp.load("payroll", parties=0)).tolist() == [0.0, 1.0, 2.0]

    with rig.connect() as analyst, rig.connect("mallory") as mallory:
        with analyst:
            mp.save(mp.put("P0", np.arange(3.0)), "payroll", persist=True)
        with mallory:
            mp.save(mp.put("P1", np.ones(2)), "mine", persist=True)
        check(analyst, mallory)
    rig.stop_worker(0)
    rig.start_worker(0)
    with rig.connect() as analyst, rig.connect("mallory") as mallory:
        check(analyst, mallory)


# -- R4: names in another case, on real workers of a case-folding disk -----------------------

# This machine's file systems tell case apart (and its kernel mounts none that folds it), so
# the workers' persisted-values folder folds names as macOS's or Windows' would: each name's
# path is its lower-cased name's, as in test_red31_symbol_case, here in the real worker.
_FOLDING = """
from mpl.worker import symbol_disk

_path = symbol_disk.SymbolDisk._path
symbol_disk.SymbolDisk._path = lambda self, name: _path(self, name.lower())
"""


def test_another_driver_reaches_no_owned_value_by_its_name_in_another_case(
    tmp_path: Path,
) -> None:
    """The analyst persists ``Report`` on a real worker whose disk folds case; mallory's
    sealed jobs save ``report`` (before R4's fix: replacing the analyst's file), delete
    ``REPORT`` (before: removing it) and load ``rePort``. The save is refused, the delete
    deletes nothing and the load answers as a free name's; the analyst still reads it."""
    rig = Rig(tmp_path / "rig", drivers=("analyst", "mallory"))
    try:
        rig.d.add_module("sitecustomize", _FOLDING)
        rig.start_worker(0)
        rig.start_worker(1)
        with rig.connect() as analyst, rig.connect("mallory") as mallory:
            with analyst:
                mp.save(mp.put("P0", np.arange(3.0)), "Report", persist=True)
            assert os.listdir(rig.d.root / "data0" / "symbols") == ["report.sym"]  # folded
            with mallory:
                with pytest.raises(mp.MplError, match="belongs to another driver"):
                    mp.save(mp.put("P0", np.zeros(3)), "report", persist=True)
                b = GraphBuilder(2, name="delete")
                b.op("unsave", [], ranks=(0,), nout=0, symbol="REPORT")
                mallory.run(b.build([]), {})

                @mp.function
                def peek() -> Any:
                    return mp.device("P0")(lambda v: v)(mp.load("rePort", parties="P0"))

                with pytest.raises(mp.MplError, match="no value named 'rePort'"):
                    mp.fetch(peek())
            with analyst:
                assert mp.fetch(mp.load("Report", parties=0)).tolist() == [0.0, 1.0, 2.0]
    finally:
        rig.close()


# -- a save reported after its job ended (w31's leftover: listed to no one) -----------------


def test_a_save_whose_done_comes_after_its_job_failed_stays_its_owners(rig: Rig) -> None:
    """The analyst's job persists ``late`` on P0 and naps there, while P1 fails at once:
    the job ends, and the broker's Abort to P0 is held back (a slow link), so P0's Done
    listing the save comes after the job ended. Before w32-trust the broker kept the name
    as no one's: the analyst could neither list, load nor delete its own value through the
    broker until P0 registered again. Now it is the analyst's."""
    rig.tap.alter = lambda msg: [] if isinstance(msg, Abort) else None
    with rig.connect() as analyst, analyst:

        @mp.function
        def job() -> Any:
            value = mp.device("P0")(lambda: np.arange(3.0))()
            mp.save(value, "late", persist=True)
            return mp.device("P0")(nap)(0.5), mp.device("P1")(boom)(1)

        with pytest.raises(mp.MplError, match="boom"):
            mp.fetch(job())
        wait_until(
            lambda: any(isinstance(m, Done) and m.rank == 0 and m.saved for m in rig.tap.received),
            20,
            "P0's late Done",
        )
        rig.tap.alter = None
        assert [row["name"] for row in mp.symbols()["persisted"]] == ["late"]
        assert mp.fetch(mp.load("late", parties=0)).tolist() == [0.0, 1.0, 2.0]
        mp.delete("late", parties=0)
        assert mp.symbols()["persisted"] == []
    assert not (rig.d.root / "data0" / "symbols" / "late.sym").exists()
    with rig.connect("mallory") as mallory, mallory:
        assert mp.symbols()["persisted"] == []
