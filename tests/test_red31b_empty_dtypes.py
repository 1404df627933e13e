"""Second red team w31, finding B2: numpy arrays whose items take no bytes.

An array's buffer must hold exactly its shape's items, so an array cannot claim more than
its bytes, but for a dtype of size 0 (``V0``, ``S0``, ``U0``): 2**48 of those take no
bytes, and the decoder built them (``np.empty``) from a header of a few dozen bytes.
Copying such a value (``np.array(x)``, ``x.copy()``) walks every item: about 10 ns each,
days for 2**48. A field of no bytes hides in a structured dtype too: one 8-byte item whose
subarray holds 2**30 structs of a field of size 0 took 10 s to copy, per item. Values
cross parties as peer moves (decoded on a worker's peer thread), results and fetch
replies, so one hostile party (or the broker, to a driver) sent them. Now a dtype with any
part of size 0 is refused by the receiver (``ProtocolError``) and the sender
(``UnsafeValueError``).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from mpl.wire.codec import decode, encode
from mpl.wire.errors import ProtocolError, UnsafeValueError
from mpl.wire.jobs import Lit

# a struct holding a subarray of 2**30 structs whose one field is a subarray of size 0
_HIDDEN = [("x", "<f8"), ("y", [("z", "<f8", (0,))], (1 << 15, 1 << 15))]


def _forged(descr: Any, shape: list[int], buffer: bytes) -> list[Any]:
    """A Lit's frames as a hostile sender writes them: an ordinary array's, its dtype,
    shape and buffer swapped (the ARRAY extension's payload is [descr, shape, index])."""
    frames = list(encode(Lit(np.zeros(1)), safe=True))
    header = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)

    def swap(item: Any) -> Any:
        if isinstance(item, msgpack.ExtType) and item.code == 1:
            return msgpack.ExtType(1, msgpack.packb([descr, shape, 0]))
        if isinstance(item, list):
            return [swap(x) for x in item]
        return item

    frames[1] = msgpack.packb(swap(header))
    frames[2] = buffer
    return frames


def _lit_value(frames: list[Any]) -> Any:
    lit = decode(frames, safe=True)
    assert isinstance(lit, Lit)
    return lit.value


@pytest.mark.parametrize("descr", ["|V0", "|S0", "<U0"])
def test_an_array_of_items_of_no_bytes_is_refused(descr: str) -> None:
    frames = _forged(descr, [1 << 48], b"")
    with pytest.raises(ProtocolError, match="takes no bytes"):
        decode(frames, safe=True)


def test_a_field_of_no_bytes_hidden_in_a_struct_is_refused() -> None:
    frames = _forged(_HIDDEN, [4], bytes(32))
    with pytest.raises(ProtocolError, match="takes no bytes"):
        decode(frames, safe=True)


def test_the_forged_frames_are_otherwise_well_formed() -> None:
    # the same forgery with an ordinary dtype decodes: only the dtype is refused above
    value = _lit_value(_forged("<f8", [4], bytes(32)))
    assert value.shape == (4,) and value.dtype == np.float64


def test_the_sender_refuses_them_first() -> None:
    for array in (
        np.empty(3, "V0"),
        np.empty((2, 3), "V0"),
        np.zeros(2, np.dtype([("x", "<f8"), ("e", "V0")])),
    ):
        with pytest.raises(UnsafeValueError, match="takes no bytes"):
            encode(Lit(array), safe=True)
    with pytest.raises(UnsafeValueError, match="takes no bytes"):
        encode(Lit(np.empty(1, "V0")[0]), safe=True)


def test_ordinary_and_structured_arrays_still_travel() -> None:
    arrays = [
        np.arange(12.0).reshape(3, 4),
        np.zeros((0, 5)),
        np.array([b"ab", b""]),
        np.zeros(3, [("a", "<i4"), ("b", "<f8", (2,))]),
        np.arange(6)[::2],
    ]
    for array in arrays:
        back = _lit_value(encode(Lit(array), safe=True))
        np.testing.assert_array_equal(back, array)
        assert back.dtype == array.dtype
