"""Persisted values are never lost: a full disk, concurrent saves, crashes and bad names."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpl.driver as mp
from mpl.wire import GraphBuilder
from mpl.wire.errors import ProtocolError, RemoteError, SessionError
from mpl.wire.jobs import Lit, output_uri
from mpl.wire.persist import dumps
from mpl.wire.sessions import SymbolInfo
from mpl.worker.store import ObjectStore
from mpl.worker.symbol_disk import SymbolDisk


def _info(name: str) -> SymbolInfo:
    return SymbolInfo(name, "P0", (0,), True, {})


def _leftovers(disk: SymbolDisk) -> list[str]:
    return sorted(p.name for p in disk.dir.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, so a save can run out of space (needs root: CI runs as root)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make a small filesystem")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=10, check=False)


def test_a_full_disk_during_an_overwrite_keeps_the_old_value(small_tmpfs: Path) -> None:
    disk = SymbolDisk(small_tmpfs)
    old = np.arange(40_000, dtype=np.int64)  # 320 kB: fits
    disk.save(_info("model"), old)
    with pytest.raises(OSError, match="No space left on device") as err:
        disk.save(_info("model"), np.ones(200_000))  # 1.6 MB: cannot fit
    assert "'model'" in str(err.value) and "unchanged" in str(err.value)
    assert _leftovers(disk) == []
    assert np.array_equal(disk.load("model"), old)  # the cache still holds the old value
    again = SymbolDisk(small_tmpfs)  # and so does the disk, read afresh
    assert np.array_equal(again.load("model"), old)
    assert [i.name for i in again.infos()] == ["model"] and again.stats()["corrupt_files"] == 0


def test_a_full_disk_fails_a_save_inside_a_job_naming_it(small_tmpfs: Path) -> None:
    sim = mp.Simulator.simple(2, data_root=small_tmpfs)
    try:
        with sim:

            @mp.function
            def keep(n: int) -> Any:
                v = mp.device("P0")(lambda: np.ones(n))()
                mp.save(v, "model", persist=True)
                return mp.device("P0")(lambda a: a.sum())(v)

            assert mp.fetch(keep(1000)) == 1000.0
            with pytest.raises(RemoteError, match=r"\(save 'model'\).*No space left") as err:
                keep(200_000)  # 1.6 MB: cannot fit
            assert err.value.rank == 0 and "unchanged" in str(err.value)
            assert mp.fetch(mp.load("model", parties=0)).tolist() == [1.0] * 1000
    finally:
        sim.close()


def test_two_concurrent_saves_of_one_name_leave_one_whole_value(tmp_path: Path) -> None:
    disk = SymbolDisk(tmp_path)
    values = [np.full(300_000, float(k)) for k in range(2)]
    errors: list[BaseException] = []

    def saver(k: int) -> None:
        try:
            for _ in range(15):
                disk.save(_info("shared"), values[k])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=saver, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    got = SymbolDisk(tmp_path).load("shared")
    assert got.shape == (300_000,) and len(set(got.tolist())) == 1  # one whole value
    assert _leftovers(disk) == []


def test_names_that_leave_the_data_root_are_refused_on_every_path(tmp_path: Path) -> None:
    disk = SymbolDisk(tmp_path / "root")
    # a value another program left beside the data root, in the layout disks used to have
    outside = tmp_path / "root" / "secret"
    outside.with_suffix(".info").write_bytes(dumps(_info("secret")))
    outside.with_suffix(".value").write_bytes(dumps(Lit("do not read")))
    store = ObjectStore(disk)
    for bad in ("../secret", "../../x", "/etc/passwd", ".hidden", ""):
        with pytest.raises(ValueError, match="bad value name"):
            store.get("s1", f"sym:{bad}")
        with pytest.raises(ValueError, match="bad value name"):
            disk.delete(bad)
        with pytest.raises(ValueError, match="bad value name"):
            disk.save(_info(bad), 1)
    assert outside.with_suffix(".info").exists()


def test_a_corrupt_file_is_reported_not_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = SymbolDisk(tmp_path)
    disk.save(_info("good"), [1, 2])
    (disk.dir / "bad.sym").write_bytes(b"MPS\x01" + b"\xff" * 20)
    with caplog.at_level(logging.ERROR, logger="mpl.worker"):
        names = [i.name for i in disk.scan()]
    assert names == ["good"]
    assert disk.stats()["corrupt_files"] == 1
    assert any("bad.sym" in r.getMessage() for r in caplog.records)
    with pytest.raises(ProtocolError, match=r"bad\.sym"):
        disk.load("bad")


def test_a_crash_mid_save_leaves_the_old_value_and_no_temporary(tmp_path: Path) -> None:
    disk = SymbolDisk(tmp_path)
    disk.save(_info("v"), "old")
    (disk.dir / ".v.0123456789abcdef.tmp").write_bytes(b"half a new value")  # never renamed
    fresh = SymbolDisk(tmp_path)
    assert fresh.load("v") == "old"
    assert _leftovers(fresh) == []
    fresh.delete("v")
    assert SymbolDisk(tmp_path).infos() == []


@pytest.mark.daemons
def test_a_restarted_broker_learns_the_names_persisted_now(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    client = cluster.client()
    sid = client.open_session().session
    b = GraphBuilder(2)
    v = b.op("constant", [], ranks=(1,), value=np.arange(3))[0]
    job = client.submit(sid, b.build([v]), {}, timeout=5).job
    for name in ("kept", "gone"):  # both saved after the worker started
        client.save_symbol(sid, output_uri(job, 0), SymbolInfo(name, "P1", (1,), True, {}))
    client.load_symbol(sid, "gone")  # a persisted name is reached through a load first
    client.delete_symbol(sid, "gone")
    cluster.impl.kill_broker()
    cluster.impl.start_broker()
    cluster.impl.wait_ready()  # polled; a loaded machine may need seconds
    fresh = client.open_session().session
    assert client.load_symbol(fresh, "kept").ranks == (1,)
    assert client.fetch(fresh, 1, "sym:kept", timeout=5).tolist() == [0, 1, 2]
    with pytest.raises(SessionError, match="no value named 'gone'"):
        client.load_symbol(fresh, "gone")
