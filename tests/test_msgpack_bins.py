"""``bin_bounds`` finds a msgpack bin's bytes from its head, as msgpack itself packs them."""

from __future__ import annotations

import msgpack
import pytest

from mpl.wire.msgpack_bins import BIN8, BIN16, BIN32, bin_bounds


@pytest.mark.parametrize("n", [0, 1, 255, 256, 65535, 65536])
def test_the_bounds_of_every_bin_width_msgpack_packs(n: int) -> None:
    value = bytes(range(256)) * (n // 256) + bytes(n % 256)
    data = b"\x01" + msgpack.packb(value) + b"\x02"  # something before and after it
    bounds = bin_bounds(data, 1)
    assert bounds is not None
    start, stop = bounds
    assert data[start:stop] == value and stop == len(data) - 1


def test_a_narrower_width_or_another_kind_is_none() -> None:
    wide = msgpack.packb(bytes(65536))
    assert wide[0] == BIN32 and bin_bounds(wide, 0, widest=BIN16) is None
    assert msgpack.packb(bytes(300))[0] == BIN16
    assert bin_bounds(msgpack.packb(bytes(300)), 0, widest=BIN8) is None
    for other in ("x", [b"x"], 7, None):
        assert bin_bounds(msgpack.packb(other), 0) is None


def test_a_head_cut_short_is_none_and_a_body_cut_short_is_the_callers() -> None:
    assert bin_bounds(b"", 0) is None
    assert bin_bounds(bytes([BIN8]), 0) is None
    assert bin_bounds(bytes([BIN16, 0]), 0) is None
    assert bin_bounds(bytes([BIN32, 0, 0, 1]), 0) is None
    assert bin_bounds(b"\xc4\x05ab", 0) == (2, 7)  # says 5 bytes, 2 there: stop past the end
