"""The broker's lean Exec reader (``mpl.wire.hot.read_exec``) against the general decode.

It builds the driver's Exec without the general decoder, so it must accept exactly what
``decode`` accepts (bar extension types other than tuples of ints, which it leaves to
``decode``) and build the same record: compared here on mutated messages.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from helpers import decoded_exec, mutated, sample_execs

from mpl.wire.codec import MAGIC_FRAME, encode
from mpl.wire.hot import EXEC_PREFIX, read_exec
from mpl.wire.jobs import Exec


def _bases() -> list[Exec]:
    # and a rank and an inline index past the fixints
    return [*sample_execs(), Exec("sess", "j", "dig", (0, 200), {}, (1 << 40,))]


def _plain(header: bytes) -> bool:
    """No extension type in the header but tuples of 32-bit non-negative ints (what
    read_exec reads itself: tuples of larger ints can flood one hash as a map's keys, and
    are left to decode, which counts them; red team w31, R1)."""
    ok = [True]

    def ext(code: int, data: bytes) -> Any:
        items = msgpack.unpackb(data, raw=False) if code == 4 else None
        if (
            code != 4
            or type(items) is not list
            or not all(type(i) is int and 0 <= i < 1 << 32 for i in items)
        ):
            ok[0] = False
        return None

    msgpack.unpackb(header, raw=False, strict_map_key=False, ext_hook=ext)
    return ok[0]


def _check(frames: list[bytes]) -> bool:
    read = read_exec(frames)
    want = decoded_exec(frames)
    if want is None:
        assert read is None, f"read_exec took what decode refuses: {frames[1]!r}"
        return False
    if read is None and not _plain(frames[1]):
        return False
    assert read is not None, f"read_exec refused a plain Exec decode takes: {frames[1]!r}"
    assert type(read) is Exec and read == want
    return True


def test_every_plain_exec_is_read_as_decode_reads_it() -> None:
    from mpl.wire.decoder import TUPLE

    assert TUPLE == 4  # _plain above names it by number
    for exe in _bases():
        frames = [bytes(f) for f in encode(exe)]
        assert frames[1].startswith(EXEC_PREFIX)
        assert _check(frames) == _plain(frames[1])


def test_mutated_execs_are_read_exactly_when_decode_accepts_them() -> None:
    rng = random.Random(1312)
    taken = refused = 0
    for exe in _bases():
        header = bytes(encode(exe)[1])
        for _ in range(300):
            if _check([MAGIC_FRAME, mutated(header, rng)]):
                taken += 1
            else:
                refused += 1
    assert taken > 100 and refused > 100


@pytest.mark.parametrize(
    "fields",
    [
        ["s", "j", "d", [0, 1], {}, (), 0.0],  # ranks a list, not a tuple
        ["s", "j", 5, (0,), {}, (), 0.0],  # digest not a string
        ["s", "j", "d", (0,), {"0": []}, (), 0.0],  # bindings keyed by a string
        ["s", "j", "d", (0,), [], (), 0.0],  # bindings not a map
        ["s", "j", "d", (0,), {}, (), "1"],  # timeout a string
        ["s", "j", "d", (0,), {}, (), True],  # a bool is no timeout
        ["s", "j", "d", (0,), {}, ()],  # a field missing
    ],
)
def test_an_exec_with_a_malformed_field_is_left_to_decode_which_refuses_it(
    fields: list[Any],
) -> None:
    def default(obj: Any) -> Any:
        return msgpack.ExtType(4, msgpack.packb(list(obj)))

    header = msgpack.packb(["exec", *fields], default=default, use_bin_type=True, strict_types=True)
    frames = [MAGIC_FRAME, header]
    assert read_exec(frames) is None
    assert decoded_exec(frames) is None


def test_an_exec_whose_bindings_nest_nothing_is_not_scanned_for_nesting() -> None:
    """A job without inputs, or a secure job (each rank's bindings a sealed box), nests
    nothing the nesting bound could refuse: its header is read without a pass over its
    bytes for list and map markers (bac702e made one per Exec longer than MAX_NESTING)."""
    import sys

    from mpl.wire.codec import decode
    from mpl.wire.limits import MAX_NESTING

    for bindings in ({}, {0: b"\x01" * 60, 1: b"\x02" * 60}):
        msg = Exec("s" + "5" * 16, "a" * 24, "d" * 64, (0, 1), bindings, (0,), 60.0)
        raw = encode(msg)
        assert len(raw[1]) > MAX_NESTING
        scans = 0

        def count(frame: Any, event: str, arg: Any) -> None:
            nonlocal scans
            scans += event == "c_call" and getattr(arg, "__name__", "") == "translate"

        sys.setprofile(count)
        try:
            read = read_exec(raw)
        finally:
            sys.setprofile(None)
        assert read == decode(raw) == msg
        assert scans == 0
