"""The file kernels (``mpl.io.*``) keep a secure worker's driver to its own folder by file
descriptors, not by resolving a path and opening it later (w31-sec, items 1 and 2).

Attack: a symbolic link swapped in between the folder check and the open (an operator's
kernel that makes links in a driver's folder, or anything else that writes there) made the
open follow it out of the folder. Now every part of a path is opened relative to its
parent's descriptor with ``O_NOFOLLOW``, from a descriptor of the data root: a link at any
part is refused, whenever it appeared. And a driver's folder has a byte quota, so its jobs
cannot fill the worker's disk through the write kernels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpl.worker import io_kernels
from mpl.worker.kernel_table import KernelTable


def _runner(root: Path, **kw: Any) -> Callable[..., Any]:
    table = KernelTable(lambda: {}, root=root, per_driver=True, **kw)

    def run(driver: str, kernel: str, *args: Any, **kwargs: Any) -> Any:
        return table.resolve(kernel, "s", f"driver:{driver}")(*args, **kwargs)

    return run


def _layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the data root, mallory's folder holding sub/x.npy = [1.0], a folder outside the
    data root holding x.npy = [666.0], the analyst's secret say)."""
    root = tmp_path / "data"
    own = root / "drivers" / "mallory"
    (own / "sub").mkdir(parents=True)
    np.save(own / "sub" / "x.npy", np.array([1.0]))
    outside = tmp_path / "outside"
    outside.mkdir()
    np.save(outside / "x.npy", np.array([666.0]))
    return root, own, outside


def test_a_symlink_swapped_in_between_check_and_open_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race made deterministic: the swap happens as the kernel starts reading, after any
    check of the path. Before: ``np.load`` opened the checked path by name and followed the
    new link out of the folder, reading the file outside (666)."""
    root, own, outside = _layout(tmp_path)
    run = _runner(root)
    real_load = np.load
    swapped: list[bool] = []

    def swap_then_load(file: Any, *args: Any, **kwargs: Any) -> Any:
        if not swapped:
            (own / "sub").rename(own / "sub.kept")
            (own / "sub").symlink_to(outside, target_is_directory=True)
            swapped.append(True)
        return real_load(file, *args, **kwargs)

    monkeypatch.setattr(np, "load", swap_then_load)
    try:
        got = run("mallory", "mpl.io.read_npy", "sub/x.npy")
    except PermissionError:
        got = None  # refused: also no escape
    assert swapped, "the swap happened before the read"
    assert got is None or got.tolist() == [1.0], "the read followed a link out of the folder"


@pytest.mark.parametrize("path", ["alias/x.npy", "link.npy", "sub/../sub/x.npy"])
def test_a_path_through_a_symlink_at_any_part_is_refused_even_inside(
    tmp_path: Path, path: str
) -> None:
    """A link placed before the call, even one that stays inside the folder: the walk opens
    no link at any part, so whatever a link points to when the file is opened, it is not
    followed. Before: a link whose target resolved inside was followed."""
    root, own, _ = _layout(tmp_path)
    (own / "alias").symlink_to(own / "sub", target_is_directory=True)
    (own / "link.npy").symlink_to(own / "sub" / "x.npy")
    run = _runner(root)
    with pytest.raises(PermissionError):
        run("mallory", "mpl.io.read_npy", path)
    assert run("mallory", "mpl.io.read_npy", "sub/x.npy").tolist() == [1.0]


def test_a_write_follows_no_symlink_and_a_link_out_stays_refused(tmp_path: Path) -> None:
    root, own, outside = _layout(tmp_path)
    (own / "alias").symlink_to(own / "sub", target_is_directory=True)
    (own / "out").symlink_to(outside, target_is_directory=True)
    run = _runner(root)
    for path in ("alias/y.npy", "out/x.npy", "out/new/y.npy"):
        with pytest.raises(PermissionError):
            run("mallory", "mpl.io.write_npy", path, np.zeros(2))
        with pytest.raises(PermissionError):
            run("mallory", "mpl.io.write_csv", path, np.zeros((1, 2)))
    for path in ("out/x.npy", "alias/x.npy"):
        with pytest.raises(PermissionError):
            run("mallory", "mpl.io.read_npy", path)
    assert not (own / "sub" / "y.npy").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["x.npy"]
    assert np.load(outside / "x.npy").tolist() == [666.0]


def test_the_drivers_folder_itself_is_walked_without_following_links(tmp_path: Path) -> None:
    """``drivers`` or ``drivers/<name>`` made a link (to another driver's folder, say) is
    refused too: only the data root itself is opened as the operator gave it."""
    root = _layout(tmp_path)[0]
    (root / "drivers" / "analyst").mkdir()
    np.save(root / "drivers" / "analyst" / "secret.npy", np.array([7.0]))
    (root / "drivers" / "eve").symlink_to(root / "drivers" / "analyst")
    run = _runner(root)
    with pytest.raises(PermissionError):
        run("eve", "mpl.io.read_npy", "secret.npy")
    with pytest.raises(PermissionError):
        run("eve", "mpl.io.write_npy", "planted.npy", np.zeros(1))
    assert not (root / "drivers" / "analyst" / "planted.npy").exists()


def test_a_write_replaces_a_file_whole_by_a_rename_in_its_folder(tmp_path: Path) -> None:
    root, own, _ = _layout(tmp_path)
    run = _runner(root)
    run("mallory", "mpl.io.write_npy", "sub/x.npy", np.array([2.0, 3.0]))
    run("mallory", "mpl.io.write_csv", "t/u/v.csv", np.array([[1.0, 2.0]]), header="a,b")
    assert np.load(own / "sub" / "x.npy").tolist() == [2.0, 3.0]
    assert (own / "t" / "u" / "v.csv").read_text().startswith("a,b\n")
    assert run("mallory", "mpl.io.read_csv", "t/u/v.csv", skip_header=1).tolist() == [[1.0, 2.0]]
    assert sorted(p.name for p in (own / "sub").iterdir()) == ["x.npy"]  # no temp file left
    with pytest.raises(PermissionError):  # a folder is not a file to replace
        run("mallory", "mpl.io.write_npy", "sub", np.zeros(1))


def test_a_fifo_in_a_folder_does_not_block_the_read(tmp_path: Path) -> None:
    """An open of a FIFO for reading waits for a writer: forever, on a job thread."""
    root, own, _ = _layout(tmp_path)
    os.mkfifo(own / "pipe.npy")
    with pytest.raises(PermissionError, match="not a regular file"):
        _runner(root)("mallory", "mpl.io.read_npy", "pipe.npy")


# -- item 2: a byte quota per driver folder -------------------------------------------------


def test_a_driver_cannot_write_past_its_folders_quota(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    quota = 64 * 1024
    run = _runner(root, quota=quota)
    run("mallory", "mpl.io.write_npy", "a.npy", np.zeros(4_000))  # 32 KiB and a header
    for kernel, value in (
        ("mpl.io.write_npy", np.zeros(4_000)),
        ("mpl.io.write_csv", np.zeros((2_000, 2))),
    ):
        with pytest.raises(io_kernels.DriverQuotaError, match="quota of 65536 bytes") as info:
            run("mallory", kernel, "more/b.out", value)
        assert info.value.errno is not None
        assert "--driver-quota" in str(info.value)
    own = root / "drivers" / "mallory"
    assert sorted(p.name for p in own.iterdir()) == ["a.npy"]  # nothing partial, no folder
    run("mallory", "mpl.io.write_npy", "a.npy", np.ones(4_000))  # a replacement fits
    assert np.load(own / "a.npy")[0] == 1.0
    run("analyst", "mpl.io.write_npy", "a.npy", np.zeros(4_000))  # a quota of its own
    with pytest.raises(io_kernels.DriverQuotaError):
        run("mallory", "mpl.io.write_npy", "c.npy", np.zeros(5_000))
    assert sorted(p.name for p in own.iterdir()) == ["a.npy"]


def test_many_small_files_count_against_the_quota_too(tmp_path: Path) -> None:
    """Each file and folder counts at least one 4 KiB block: empty files fill a disk's
    inodes and blocks as well."""
    root = tmp_path / "data"
    root.mkdir()
    run = _runner(root, quota=10 * 4096)
    for n in range(5):  # a folder and a file each: 10 blocks
        run("mallory", "mpl.io.write_csv", f"d{n}/e.csv", np.zeros((0, 2)))
    with pytest.raises(io_kernels.DriverQuotaError):
        run("mallory", "mpl.io.write_csv", "d5/e.csv", np.zeros((0, 2)))
    assert not (root / "drivers" / "mallory" / "d5").exists()


def test_a_quota_of_zero_is_none_and_the_default_is_a_gibibyte(tmp_path: Path) -> None:
    assert io_kernels.DEFAULT_DRIVER_QUOTA == 1 << 30
    root = tmp_path / "data"
    root.mkdir()
    run = _runner(root, quota=0)
    run("mallory", "mpl.io.write_npy", "a.npy", np.zeros(100_000))
    assert (root / "drivers" / "mallory" / "a.npy").stat().st_size > 800_000


def test_the_worker_takes_its_quota_from_the_command_line() -> None:
    from click.testing import CliRunner

    from mpl.worker import cli

    assert "--driver-quota" in CliRunner().invoke(cli.main, ["--help"]).output
    (option,) = [p for p in cli.main.params if p.name == "driver_quota"]
    size = cli.ByteSize()
    assert size.convert(option.default, None, None) == io_kernels.DEFAULT_DRIVER_QUOTA
    assert [size.convert(v, None, None) for v in ("0", "512K", "10GiB", "3m")] == [
        0,
        512 << 10,
        10 << 30,
        3 << 20,
    ]
    with pytest.raises(Exception, match="not a size"):
        size.convert("1.5G", None, None)
    with pytest.raises(ValueError, match=">= 0"):
        KernelTable(lambda: {}, per_driver=True, quota=-1)


def test_a_write_makes_a_missing_data_root_as_before(tmp_path: Path) -> None:
    run = _runner(tmp_path / "not-yet")
    run("mallory", "mpl.io.write_npy", "a.npy", np.arange(3.0))
    assert run("mallory", "mpl.io.read_npy", "a.npy").tolist() == [0.0, 1.0, 2.0]


# -- review w31-rev-sec ---------------------------------------------------------------------


def _stat_calls(monkeypatch: pytest.MonkeyPatch, work: Callable[[], Any]) -> int:
    """The ``os.stat`` calls ``work()`` makes (``os.fwalk`` stats through it too)."""
    real_stat = os.stat
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real_stat(*args, **kwargs)

    monkeypatch.setattr(os, "stat", counted)
    try:
        work()
    finally:
        monkeypatch.setattr(os, "stat", real_stat)
    return calls[0]


def _stats_of_one_write(
    run: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, path: str, value: Any
) -> int:
    """The ``os.stat`` calls one write makes."""
    return _stat_calls(monkeypatch, lambda: run("mallory", "mpl.io.write_npy", path, value))


def test_a_write_does_not_look_at_every_file_its_folder_already_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a driver limited to kernels (``code: kernels``) fills its folder with
    small files (up to quota / 4 KiB of them: 262,144 by default), then each of its writes
    counted the quota by a walk of them all, a stat per file, on the worker's job threads:
    one cheap job, a quarter million system calls. The count is kept as writes go now;
    the folder is walked once, not at every write."""
    root = tmp_path / "data"
    own = root / "drivers" / "mallory" / "many"
    own.mkdir(parents=True)
    for n in range(2_000):  # as earlier writes would have left them
        (own / f"f{n}").write_bytes(b"x")
    run = _runner(root)
    run("mallory", "mpl.io.write_npy", "first.npy", np.zeros(1))  # may count them, once
    stats = [_stats_of_one_write(run, monkeypatch, f"next{n}.npy", np.zeros(1)) for n in range(5)]
    assert max(stats) < 100, f"one write made {max(stats)} stat calls"


def test_a_count_stops_once_it_passes_the_quota_folders_alone_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder of folders and no files (the operator's, or left by writes under a larger
    quota) is counted no further than the quota either: each folder is a block."""
    root = tmp_path / "data"
    own = root / "drivers" / "mallory"
    for n in range(500):
        (own / f"d{n}").mkdir(parents=True)
    run = _runner(root, quota=8 * 4096)

    def refused_write() -> None:
        with pytest.raises(io_kernels.DriverQuotaError):
            run("mallory", "mpl.io.write_npy", "b.npy", np.zeros(1))

    calls = _stat_calls(monkeypatch, refused_write)
    assert calls < 50, f"a refused write made {calls} stat calls"


def test_the_quota_still_holds_across_writes_and_sees_room_the_operator_freed(
    tmp_path: Path,
) -> None:
    """With the count kept between writes: a write past the quota is still refused, a
    replacement is credited what it replaces, and files the operator removes from the
    folder free their room for the next write (a refusal recounts the folder)."""
    root = tmp_path / "data"
    root.mkdir()
    run = _runner(root, quota=16 * 4096)
    for n in range(3):
        run("mallory", "mpl.io.write_npy", f"d/a{n}.npy", np.zeros(900))  # 2 blocks each
    run("mallory", "mpl.io.write_npy", "d/a0.npy", np.zeros(1_400))  # 3 blocks, replacing 2
    with pytest.raises(io_kernels.DriverQuotaError):  # 1 + 3 + 2 + 2 = 8 used, 9 asked
        run("mallory", "mpl.io.write_npy", "big.npy", np.zeros(9 * 512 - 20))
    run("mallory", "mpl.io.write_npy", "fits.npy", np.zeros(7 * 512 - 20))  # 15 of 16
    with pytest.raises(io_kernels.DriverQuotaError):
        run("mallory", "mpl.io.write_npy", "one-more.npy", np.zeros(600))
    own = root / "drivers" / "mallory"
    (own / "fits.npy").unlink()  # the operator makes room
    run("mallory", "mpl.io.write_npy", "one-more.npy", np.zeros(600))  # 10 of 16
    run("mallory", "mpl.io.write_npy", "d/six.npy", np.zeros(6 * 512 - 16))  # 16 of 16
    with pytest.raises(io_kernels.DriverQuotaError):
        run("mallory", "mpl.io.write_npy", "d/last.npy", np.zeros(600))
    (own / "d" / "a1.npy").unlink()  # deeper down: the driver's folder itself is unchanged
    run("mallory", "mpl.io.write_npy", "d/last.npy", np.zeros(600))
    assert sorted(p.name for p in own.iterdir()) == ["d", "one-more.npy"]
    assert sorted(p.name for p in (own / "d").iterdir()) == [
        "a0.npy",
        "a2.npy",
        "last.npy",
        "six.npy",
    ]
    with pytest.raises(io_kernels.DriverQuotaError):
        run("mallory", "mpl.io.write_npy", "d/a1.npy", np.zeros(1))


def test_a_size_in_other_scripts_digits_is_a_usage_error_not_a_crash() -> None:
    """``str.isdigit`` accepts '²' and other digits ``int`` cannot read: the option's
    parser raised a bare ValueError (a traceback at start) instead of naming the option."""
    import click

    from mpl.worker import cli

    for text in ("²", "1²G", "٣M"):
        with pytest.raises(click.BadParameter, match="not a size"):
            cli.ByteSize().convert(text, None, None)


def test_a_long_csv_delimiter_does_not_make_the_worker_build_rows_the_quota_refuses(
    tmp_path: Path,
) -> None:
    """Attack: ``np.savetxt`` builds each row as one string, the delimiter between every
    two columns, before a byte reaches the file: a delimiter of n characters and a row of
    m columns cost n * m bytes of memory (16 MiB, a header's limit, times a million
    columns: the worker is killed), which the quota, counting bytes written, never sees.
    A delimiter is a few characters now; a longer one is refused before anything is
    built."""
    import tracemalloc

    root = tmp_path / "data"
    root.mkdir()
    run = _runner(root, quota=64 * 1024)
    row = np.zeros((1, 1_000))
    tracemalloc.start()
    try:
        with pytest.raises((ValueError, io_kernels.DriverQuotaError)):
            run("mallory", "mpl.io.write_csv", "wide.csv", row, delimiter="," * 50_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"a refused write built {peak} bytes"
    assert not list((root / "drivers" / "mallory").glob("*"))
    run("mallory", "mpl.io.write_csv", "ok.csv", row, delimiter=" | ")  # a few: as before
    run("mallory", "mpl.io.write_csv", "ok.csv", row, delimiter=";")
    assert run("mallory", "mpl.io.read_csv", "ok.csv", delimiter=";").shape == (1, 1_000)


def test_read_npy_does_not_expand_a_zip_a_driver_wrote_with_a_csv_header(
    tmp_path: Path,
) -> None:
    """Attack: ``write_csv`` writes its header's characters as bytes (latin-1), so a
    driver can write any bytes at all, a zip among them; ``read_npy`` of a zip read every
    member into memory, and a deflated member expands about a thousand times: a folder's
    quota of such files is a thousand quotas of memory. ``read_npy`` reads a .npy file
    only now."""
    import io
    import tracemalloc
    import zipfile

    member = io.BytesIO()
    np.save(member, np.zeros(12_500_000))  # 100 MB of zeros
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", member.getvalue())
    assert len(bomb.getvalue()) < 200_000
    del member
    root = tmp_path / "data"
    root.mkdir()
    run = _runner(root)
    header = bomb.getvalue().decode("latin-1")
    run("mallory", "mpl.io.write_csv", "bomb.npz", np.zeros((0, 2)), header=header)
    tracemalloc.start()
    try:
        try:
            got: Any = run("mallory", "mpl.io.read_npy", "bomb.npz")
        except ValueError:
            got = None  # refused: nothing expanded
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"reading a {len(header)}-byte file took {peak} bytes"
    del got


def test_one_drivers_failed_first_write_does_not_pull_the_drivers_folder_from_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a failed write removes the folders it made, and a driver's first write
    makes ``drivers`` too: eve, failing first writes over and over, removed ``drivers``
    while bob's write had opened it and not yet made ``drivers/bob`` in it, so bob's
    write failed (FileNotFoundError). The shared ``drivers`` folder is never removed now.
    The interleaving is forced with two threads and events."""
    import threading

    root = tmp_path / "data"
    root.mkdir()
    run = _runner(root, quota=4 * 4096)
    real_open_dir = io_kernels._open_dir
    eve_made, bob_opened, eve_done = threading.Event(), threading.Event(), threading.Event()

    def ordered(dir_fd: int, name: str, *args: Any) -> Any:
        if name == "eve":
            eve_made.set()
            assert bob_opened.wait(30), "bob never reached its folder"
        if name == "bob":
            bob_opened.set()
            assert eve_done.wait(30), "eve's write never ended"
        return real_open_dir(dir_fd, name, *args)

    monkeypatch.setattr(io_kernels, "_open_dir", ordered)
    outcome: dict[str, BaseException | None] = {}

    def eve() -> None:
        try:
            run("eve", "mpl.io.write_npy", "big.npy", np.zeros(10_000))  # past its quota
        except BaseException as exc:
            outcome["eve"] = exc
        finally:
            eve_done.set()

    def bob() -> None:
        assert eve_made.wait(30)
        try:
            run("bob", "mpl.io.write_npy", "x.npy", np.zeros(1))
            outcome["bob"] = None
        except BaseException as exc:
            outcome["bob"] = exc

    threads = [threading.Thread(target=eve), threading.Thread(target=bob)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert isinstance(outcome.get("eve"), io_kernels.DriverQuotaError)
    assert outcome.get("bob", "absent") is None, f"bob's write failed: {outcome.get('bob')!r}"
    assert np.load(root / "drivers" / "bob" / "x.npy").tolist() == [0.0]
    assert not (root / "drivers" / "eve").exists()


def test_a_file_of_more_than_one_hard_link_is_not_read_on_a_secure_worker(
    tmp_path: Path,
) -> None:
    """No driver's kernel makes a hard link, but an operator's tool may (``cp -al``, a
    backup, its own kernel): a link in mallory's folder (or at the data root) to the
    analyst's file read the analyst's bytes through it (w32-trust, item 4). A secure
    worker now reads files of one link only; a plaintext one (one folder for every driver)
    as before."""
    root, own, _ = _layout(tmp_path)
    theirs = root / "drivers" / "analyst"
    theirs.mkdir()
    np.save(theirs / "secret.npy", np.array([42.0]))
    os.link(theirs / "secret.npy", own / "peek.npy")
    os.link(theirs / "secret.npy", root / "shared.npy")
    run = _runner(root)
    for path in ("peek.npy", "shared.npy"):
        with pytest.raises(PermissionError, match="hard links"):
            run("mallory", "mpl.io.read_npy", path)
    with pytest.raises(PermissionError, match="hard links"):  # nor its owner, while linked
        run("analyst", "mpl.io.read_npy", "secret.npy")
    assert run("mallory", "mpl.io.read_npy", "sub/x.npy").tolist() == [1.0]
    run("mallory", "mpl.io.write_npy", "peek.npy", np.array([7.0]))  # replaces its own name
    assert np.load(theirs / "secret.npy").tolist() == [42.0]  # never written through
    plain = KernelTable(lambda: {}, root=root / "drivers" / "analyst", per_driver=False)
    assert plain.resolve("mpl.io.read_npy", "s", "")("secret.npy").tolist() == [42.0]
