"""Red team w31, finding R1: a hash-collision flood in a header held a decoding thread for
minutes to hours (the broker's one loop, a worker's peer thread, a driver's pump).

Python's dicts and sets compare a new key with every key of the same hash already in, so
a map of N keys sharing one hash costs N**2/2 comparisons to build. msgpack built every map
of a header before any field was checked, and keys that share a hash are free to make:
``k * (2**61 - 1) + 1`` (a BIGINT each, 12 bytes), complex numbers ``(2**52 - 1000003*b)
+ bj``, tuples of two 64-bit ints whose second is solved for the hash. 8,000 keys (110 KB)
cost about a second, a 16 MiB header hours, from anyone who may send the broker a message
(any listed driver or party; in plaintext anyone on loopback), a peer's move, or a
hostile broker's answer. Now each map or set of a decoded header with more than
``MAX_SAME_HASH`` keys of one hash is refused (``mpl.wire.limits.check_spread``), and the
Exec reader of the hot path builds tuples of 32-bit non-negative ints only.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from test_batch_nesting import _answer, broker_process, raw_dealers  # noqa: F401  (a fixture)

from mpl.wire import hot
from mpl.wire.codec import MAGIC_FRAME, decode
from mpl.wire.control import Refused
from mpl.wire.decoder import BIGINT, TUPLE
from mpl.wire.errors import ProtocolError
from mpl.wire.safe_values import COMPLEX, SET
from mpl.wire.sessions import Reply, StatusRequest

_P = (1 << 61) - 1  # CPython's int hash modulus: k * _P + 1 all hash to 1
_M = (1 << 64) - 1
# CPython's tuple hash (xxHash's lanes): invertible, so a 2-tuple's second item can be
# solved for any hash
_X1, _X2, _X5 = 11400714785074694791, 14029467366897019727, 2870177450012600261


def _bigint(n: int) -> msgpack.ExtType:
    return msgpack.ExtType(BIGINT, n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True))


def _colliding_bigints(n: int) -> list[msgpack.ExtType]:
    return [_bigint(1 + k * _P) for k in range(1, n + 1)]


def _colliding_complex(n: int) -> list[msgpack.ExtType]:
    """``(2**52 - 1000003*b) + bj``: hash(real) + 1000003 * hash(imag) is 2**52 for each."""
    import struct

    return [
        msgpack.ExtType(COMPLEX, struct.pack("<dd", float((1 << 52) - 1000003 * b), float(b)))
        for b in range(n)
    ]


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _rotr(x: int, r: int) -> int:
    return ((x >> r) | (x << (64 - r))) & _M


def _colliding_pairs(n: int) -> list[tuple[int, int]]:
    """``n`` tuples ``(a, b)`` of 64-bit ints that share one hash (``b`` solved for it)."""
    target, inverse_1, inverse_2 = 0x1234567890ABCDEF, pow(_X1, -1, 1 << 64), pow(_X2, -1, 1 << 64)
    pairs: list[tuple[int, int]] = []
    a = 0
    while len(pairs) < n:
        a += 1
        after_a = _rotl((_X5 + a * _X2) & _M, 31) * _X1 & _M
        lane = ((_rotr(target * inverse_1 & _M, 31) - after_a) * inverse_2) & _M
        if lane < _P:  # the hash of the int lane itself
            pairs.append((a, lane))
    return pairs


def _map(keys: list[Any]) -> bytes:
    """A msgpack map of ``keys``, each to 0 (packed by hand: the keys need not hash alike
    here, and a map this big of colliding keys would cost the test what it costs a victim)."""
    head: bytes = msgpack.Packer().pack_map_header(len(keys))
    return head + b"".join(msgpack.packb(key) + b"\x00" for key in keys)


def _header(*items: bytes) -> bytes:
    return bytes([0x90 | len(items)]) + b"".join(items)


def test_the_colliding_keys_made_here_do_share_one_hash() -> None:
    import struct

    ints = [1 + k * _P for k in range(1, 100)]
    complexes = [complex(*struct.unpack("<dd", e.data)) for e in _colliding_complex(100)]
    assert len({hash(k) for k in ints}) == 1
    assert len({hash(k) for k in complexes}) == 1
    assert len({hash(k) for k in _colliding_pairs(100)}) == 1


@pytest.mark.parametrize(
    "keys",
    [
        _colliding_bigints(2000),
        _colliding_complex(2000),
        [msgpack.ExtType(TUPLE, msgpack.packb(list(p))) for p in _colliding_pairs(2000)],
    ],
    ids=["bigint", "complex", "tuple"],
)
def test_decode_refuses_a_map_whose_keys_flood_one_hash(keys: list[Any]) -> None:
    # a record's field holding the map (Reply's value): refused before the map is built
    header = _header(msgpack.packb("reply"), msgpack.packb(1), _map(keys))
    with pytest.raises(ProtocolError, match="share one hash"):
        decode([MAGIC_FRAME, header], safe=True)
    with pytest.raises(ProtocolError, match="share one hash"):  # the broker's mode too
        decode([MAGIC_FRAME, header], unpickle=False)


def test_decode_refuses_a_set_whose_items_flood_one_hash() -> None:
    items = msgpack.packb([False, _colliding_bigints(2000)])
    header = _header(
        msgpack.packb("reply"), msgpack.packb(1), msgpack.packb(msgpack.ExtType(SET, items))
    )
    with pytest.raises(ProtocolError, match="share one hash"):
        decode([MAGIC_FRAME, header], safe=True)


def test_maps_and_sets_of_ordinary_keys_still_decode() -> None:
    keys = list(range(5000)) + [1 + k * _P for k in range(1, 8)]  # 64-bit ints: few alike
    value = {"ints": dict.fromkeys(keys, 0), "pairs": {(i, i + 1): i for i in range(2000)}}
    value["set"] = {-1, -2, *range(3000)}  # (-1 and -2 share a hash)
    from mpl.wire.codec import encode

    got = decode(encode(Reply(1, value), safe=True), safe=True)
    assert isinstance(got, Reply) and got.value == value


def test_the_hot_exec_reader_builds_no_flood_of_tuple_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Exec whose bindings' keys are colliding tuples: the lean reader leaves it to
    decode at the first tuple of 64-bit items (on main it built the map, 0.6 s for 8,000
    such keys, then left it to decode, which built it again)."""
    keys = [msgpack.ExtType(TUPLE, msgpack.packb(list(p))) for p in _colliding_pairs(2000)]
    header = _header(
        msgpack.packb("exec"),
        msgpack.packb("s"),
        msgpack.packb("j"),
        msgpack.packb("d"),
        msgpack.packb(msgpack.ExtType(TUPLE, b"\x91\x00")),
        _map(keys),
        msgpack.packb(msgpack.ExtType(TUPLE, b"\x90")),
        msgpack.packb(0.0),
    )
    built: list[int] = []
    real = msgpack.unpackb

    def counted(data: Any, **kw: Any) -> Any:
        out = real(data, **kw)
        built.append(1)
        return out

    monkeypatch.setattr(msgpack, "unpackb", counted)
    assert hot.read_exec([MAGIC_FRAME, header]) is None
    monkeypatch.undo()
    assert len(built) <= 1, f"the lean reader built {len(built)} tuples of 64-bit ints"
    with pytest.raises(ProtocolError, match="share one hash"):
        decode([MAGIC_FRAME, header], unpickle=False)


@pytest.mark.timeout(120)
def test_a_real_broker_refuses_a_hash_flood_from_a_raw_socket(
    broker_process: tuple[str, int],  # noqa: F811
) -> None:
    address, _ = broker_process
    with raw_dealers(address) as [sock]:
        # a status request with a field too many: its map of colliding keys is read first
        flood = _header(msgpack.packb("status"), msgpack.packb(1), _map(_colliding_bigints(3000)))
        sock.send_multipart([MAGIC_FRAME + flood])  # wire v4: magic and header, one frame
        refused = _answer(sock, Refused)
        assert "share one hash" in refused.error.message, refused.error.message
        from mpl.wire.codec import encode, to_wire

        sock.send_multipart(to_wire(encode(StatusRequest(2))))  # and it still serves
        assert isinstance(_answer(sock, Reply), Reply)
