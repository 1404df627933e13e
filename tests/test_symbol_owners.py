"""Persisted values belong to the driver that saved them (review w28-a finding 4).

The attacker is a hostile broker whose operator also holds a listed driver key (mallory).
Real ``mpl-worker`` processes with CURVE and a data root, the broker in this process behind
the tap of ``test_replay_restart``; the pure parts (the rules, the file format, the disk)
on their own. The forged ``SaveSymbol`` itself is in ``test_session_binding_review``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import wait_until
from test_replay_restart import Rig, two_workers
from test_session_driver_binding import _value_on, recorded_replies

import mpl.driver as mp
from mpl.wire.data import Fetch
from mpl.wire.errors import ProtocolError, SessionAccessError, SessionError
from mpl.wire.jobs import Lit
from mpl.wire.persist import (
    OWNED_SYMBOL_MAGIC,
    SYMBOL_MAGIC,
    read_owned_head,
    split_owned_symbol,
    split_symbol,
    symbol_chunks,
)
from mpl.wire.record import Record
from mpl.wire.sessions import Ack, DeleteSymbol, SymbolInfo
from mpl.worker.symbol_disk import SymbolDisk
from mpl.worker.symbol_owner import hidden, refuse_read, refuse_write

A, M = "driver:analyst", "driver:mallory"
INFO = SymbolInfo("kept", "P0", (0,), True, {})

# -- the rules ------------------------------------------------------------------------------


def test_a_persisted_value_is_read_only_in_its_owners_sessions() -> None:
    assert refuse_read("kept", A, A) == ""
    assert "another driver" in refuse_read("kept", A, M)
    assert "bound to no driver" in refuse_read("kept", A, "")
    assert "without an owner" in refuse_read("kept", "", A)  # an old file: no one's
    assert refuse_read("kept", "", None) == refuse_read("kept", A, None) == ""  # plaintext


def test_a_persisted_value_is_hidden_from_other_drivers_alone() -> None:
    assert hidden(A, M) and not hidden(A, A)
    assert not hidden(None, M)  # nothing persisted
    assert not hidden("", M)  # a file of no owner: refused, saying so
    assert not hidden(A, "")  # the broker's word (or a session bound to none)
    assert not hidden(A, None)  # plaintext


def test_a_persisted_value_is_replaced_or_deleted_only_by_its_owner() -> None:
    assert refuse_write("kept", None, M) == ""  # nothing there yet
    assert refuse_write("kept", A, A) == ""
    assert "another driver" in refuse_write("kept", A, M)
    assert "only by its owner" in refuse_write("kept", A, "")  # the broker's word
    assert "without an owner" in refuse_write("kept", "", M)
    assert refuse_write("kept", A, None) == ""  # plaintext


# -- the file format --------------------------------------------------------------------------


def _file(owner: str = "") -> bytes:
    return b"".join(bytes(c) for c in symbol_chunks(INFO, Lit(np.arange(3.0)), owner))


def test_an_owned_file_names_its_owner_outside_the_description(tmp_path: Path) -> None:
    data = _file(A)
    assert data.startswith(OWNED_SYMBOL_MAGIC)
    info, value, owner = split_owned_symbol(data)
    assert (info, owner) == (INFO, A) and isinstance(value, Lit)
    assert split_symbol(data)[0] == INFO
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "f", "rb") as f:
        assert read_owned_head(f) == (INFO, A)


def test_a_file_of_the_format_before_owners_reads_as_owned_by_no_one() -> None:
    forged = SymbolInfo("kept", "P0", (0,), True, {"owner": A})  # a relayed save's meta
    data = b"".join(bytes(c) for c in symbol_chunks(forged, Lit(1)))
    assert data.startswith(SYMBOL_MAGIC)
    assert split_owned_symbol(data)[2] == ""


def test_a_damaged_owner_is_a_protocol_error() -> None:
    data = _file(A)
    for bad in (data[:5], data[:4] + b"\x00\x00" + data[6:], data[:4] + b"\xff\xff" + data[6:]):
        with pytest.raises(ProtocolError):
            split_owned_symbol(bad)


# -- the disk -------------------------------------------------------------------------------


def test_the_disk_keeps_the_owner_across_a_restart_and_refuses_others(tmp_path: Path) -> None:
    disk = SymbolDisk(tmp_path)
    disk.save(INFO, np.arange(3.0), A)
    with pytest.raises(SessionAccessError, match="another driver"):
        disk.save(INFO, np.zeros(3), M)
    with pytest.raises(SessionAccessError):
        disk.delete("kept", "")  # the broker's word
    assert disk.load("kept", A).tolist() == [0.0, 1.0, 2.0]
    again = SymbolDisk(tmp_path)  # a restarted worker reads the owner from the file
    # to mallory the analyst's value is none at all (w32-trust): answered as a free name's
    with pytest.raises(SessionError) as taken:
        again.load("kept", M)
    with pytest.raises(SessionError) as free:
        again.load("kfpt", M)
    assert type(taken.value) is type(free.value) is SessionError
    assert str(taken.value).replace("kept", "kfpt") == str(free.value)
    assert again.load("kept", A).tolist() == [0.0, 1.0, 2.0]
    again.delete("kept", M)  # nothing of mallory's to delete: as for a free name
    assert again.load("kept", A).tolist() == [0.0, 1.0, 2.0]
    assert SymbolDisk(tmp_path).load("kept", A).tolist() == [0.0, 1.0, 2.0]  # the file too
    again.delete("kept", A)
    assert again.infos() == []


def test_a_file_without_an_owner_is_no_ones_on_a_secure_worker(tmp_path: Path) -> None:
    SymbolDisk(tmp_path).save(INFO, 7)  # a plaintext worker's (or an older mpl's)
    disk = SymbolDisk(tmp_path)
    assert disk.load("kept") == 7  # plaintext: as before
    for attempt in (
        lambda: disk.load("kept", A),
        lambda: disk.save(INFO, 8, A),
        lambda: disk.delete("kept", A),
    ):
        with pytest.raises(SessionAccessError, match="without an owner"):
            attempt()
    assert disk.load("kept") == 7


# -- real workers ---------------------------------------------------------------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A secure cluster of two nodes, each worker with a data root, listing drivers analyst
    and mallory (whose key the broker's operator holds)."""
    yield from two_workers(tmp_path, ("analyst", "mallory"))


def _kept(ctx: mp.Context) -> None:
    """``ctx``'s driver persists [0, 1, 2] as ``kept`` on P0."""
    with ctx:
        mp.save(mp.put("P0", np.arange(3.0)), "kept", persist=True)


def _read(ctx: mp.Context) -> Any:
    """What ``ctx``'s driver reads of P0's ``kept``, fetched, or the error kind refusing it."""
    with ctx:
        try:
            return mp.fetch(mp.load("kept", parties=0)).tolist()
        except mp.MplError as exc:
            return type(exc).__name__


@pytest.mark.daemons
def test_another_drivers_session_cannot_fetch_a_persisted_value(rig: Rig) -> None:
    """Mallory's load of the analyst's name: the broker answers it as a name no one has
    (since w31-load; before, it answered from its whole table and the worker refused the
    fetch in mallory's session, and on 0f5e5cc it sealed the value for mallory); the
    analyst's own session, a later one, reads it. Mallory's own job reaching the worker
    is the next test."""
    with rig.connect() as owner, rig.connect("mallory") as mallory:
        _kept(owner)
        assert _read(mallory) == "SessionError"
    with rig.connect() as later:
        assert _read(later) == [0.0, 1.0, 2.0]


@pytest.mark.daemons
def test_another_drivers_job_cannot_load_or_replace_a_persisted_value(rig: Rig) -> None:
    """mallory's own sealed jobs: a ``load`` op of the analyst's name returns nothing to it
    (since w32-trust answered as a name nothing is persisted under:
    ``test_attacks_daemons32`` compares the two answers), and a ``save`` op of that name
    leaves the analyst's value whole (on 0f5e5cc the load returned it and the save
    replaced it)."""
    with rig.connect() as owner, rig.connect("mallory") as mallory:
        _kept(owner)
        with mallory:

            @mp.function
            def steal() -> Any:
                return mp.device("P0")(lambda v: v)(mp.load("kept", parties="P0"))

            with pytest.raises(mp.MplError, match="no value named 'kept'"):
                mp.fetch(steal())
            with pytest.raises(mp.MplError, match="belongs to another driver"):
                mp.save(mp.put("P0", np.zeros(3)), "kept", persist=True)
        assert _read(owner) == [0.0, 1.0, 2.0]


@pytest.mark.daemons
def test_a_forged_delete_leaves_a_persisted_value_and_its_owner_deletes_it(rig: Rig) -> None:
    """The broker sends P0 a ``DeleteSymbol`` of the analyst's persisted name: P0 refuses
    it (on 0f5e5cc it deleted the file), and still serves it; the analyst's own
    ``mp.delete`` (a sealed job, then the broker's bookkeeping) deletes it."""
    got: list[Record] = recorded_replies(rig, Ack)
    with rig.connect() as owner, rig.connect("mallory") as mallory:
        _kept(owner)
        decoy = _value_on(mallory, 0, "mallory's own")
        forged = DeleteSymbol(mallory.session, 525252, "kept", (0,), True)

        def delete(msg: Any) -> list[Any] | None:  # sent to P0 with mallory's fetch
            if isinstance(msg, Fetch) and msg.uri == decoy:
                rig.tap.alter = None
                return [forged, msg]
            return None

        rig.tap.alter = delete
        assert mallory.client.fetch(mallory.session, 0, decoy) == "mallory's own"
        (ack,) = wait_until(
            lambda: [m for m in got if isinstance(m, Ack) and m.req == forged.req], 20, "the ack"
        )
        assert ack.error is not None and (ack.error.kind, ack.error.rank) == (
            "SessionAccessError",
            0,
        ), ack.error
        assert _read(owner) == [0.0, 1.0, 2.0]
        with owner:
            mp.delete("kept", parties=0)
        assert _read(owner) == "SessionError"


@pytest.mark.daemons
def test_a_persisted_value_is_its_owners_after_a_worker_restart(rig: Rig) -> None:
    """The owner is in the file: a restarted P0 serves the analyst's value to the analyst
    alone (its hello names the owner, so the broker answers mallory's load as of a name no
    one has; before w31-load it answered it and the worker refused the fetch)."""
    with rig.connect() as owner:
        _kept(owner)
    rig.stop_worker(0)
    rig.start_worker(0)
    with rig.connect() as owner, rig.connect("mallory") as mallory:
        assert _read(mallory) == "SessionError"
        assert _read(owner) == [0.0, 1.0, 2.0]


@pytest.mark.daemons
def test_the_owners_shared_session_reads_its_saved_and_persisted_names(rig: Rig) -> None:
    """Legitimate use in secure mode (the save now a sealed job): the analyst names a value
    in its session and persists another; the driver it shares the session with loads both
    there, and the analyst deletes the session name."""
    with rig.connect(session="s", share_with=["mallory"]) as owner:
        _kept(owner)
        with owner:
            mp.save(mp.put("P1", np.full(2, 7.0)), "named")
        with rig.connect("mallory", session="s") as sharee, sharee:
            assert mp.fetch(mp.load("named")).tolist() == [7.0, 7.0]
            assert _read(sharee) == [0.0, 1.0, 2.0]
        with owner:
            mp.delete("named")
            with pytest.raises(mp.MplError, match="no value named"):
                mp.load("named")
