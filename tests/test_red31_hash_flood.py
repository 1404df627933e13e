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
from mpl.wire.decoder import BIGINT, BUFFER, TUPLE
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import JobResult
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


# -- the lean readers (w32-trust, item 2) -----------------------------------------------------

_MARKERS = {*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF}  # msgpack's list and map markers


def _one_hash_numbers() -> list[Any]:
    """Every float ``2**(61*k)`` and 64-bit int ``1 + k*_P``: 41 keys of hash 1, the most
    of one hash msgpack builds from its own types (no extension)."""
    keys: list[Any] = [2.0 ** (61 * k) for k in range(-17, 17)]
    keys += [1 + k * _P for k in range(2, 9)]  # (1 is 1.0 and 1 + _P is 2.0**61)
    assert len({hash(k) for k in keys}) == 1 and len(set(keys)) == len(keys) == 41
    return keys


def _result_header(inner: bytes) -> bytes:
    """A JobResult of job ``j1`` whose one value (output 0, rank 0) is ``inner``."""
    from mpl.wire.result_read import RESULT_HEAD

    job: bytes = msgpack.packb("j1")
    return RESULT_HEAD + job + b"\x81\x00\x81\x00" + inner + b"\xc0\xc2\x80\x80"


def _answers(header: bytes) -> list[Any]:
    """What each of the driver's readers makes of ``header``: the error it raises, or what
    it read."""
    from mpl.wire import result_read

    out: list[Any] = []
    head = result_read.RESULT_HEAD + msgpack.packb("j1")
    for read in (
        lambda: result_read.read_answer([MAGIC_FRAME, header], safe=True),
        lambda: result_read.answer_fields(MAGIC_FRAME + header, head, safe=True),
        lambda: result_read.result_fields([MAGIC_FRAME, header], head, safe=True),
    ):
        try:
            out.append(read())
        except ProtocolError as exc:
            out.append(exc)
    return out


def test_the_drivers_short_answer_reader_refuses_bigint_keys_flooding_one_hash() -> None:
    """A broker's answer under 8 KiB with few list and map markers is read without the
    Decoder's hooks, which count each map's hashes: 600 BIGINT keys of one hash (payloads
    chosen free of marker bytes) in one map took the driver 2 ms to build (the square of
    their number) and were accepted, where decode refuses them. Now a map the uncounted
    read builds holds at most MAX_SAME_HASH keys; a longer one is read counted."""
    keys = [k for k in _colliding_bigints(900) if not _MARKERS & set(msgpack.packb(k))][:600]
    header = _result_header(_map(keys))
    assert len(header) < 8192 and sum(b in _MARKERS for b in header) < 100
    with pytest.raises(ProtocolError, match="share one hash"):
        decode([MAGIC_FRAME, header], safe=True)
    for answer in _answers(header):
        assert isinstance(answer, ProtocolError) and "share one hash" in str(answer), answer
    # beside a buffer frame (a bytes value): read by the Decoder, uncounted, before too
    from mpl.wire.result_read import read_answer

    buffer = msgpack.packb(msgpack.ExtType(BUFFER, msgpack.packb([0, 0])))
    header = _result_header(b"\x92" + buffer + _map(keys))
    assert len(header) < 8192 and sum(b in _MARKERS for b in header) < 100
    with pytest.raises(ProtocolError, match="share one hash"):
        read_answer([MAGIC_FRAME, header, b"bytes"], safe=True)


def test_the_lean_readers_accept_no_map_of_more_one_hash_keys_than_decode() -> None:
    """41 keys of one hash from msgpack's own types (floats and ints): each lean reader
    (the driver's answers, the broker's Dones and Execs) built such maps and accepted them,
    where decode refuses a map of more than MAX_SAME_HASH (a 256 KiB Done of them held the
    broker's loop 15 ms). Now each leaves them to decode."""
    flood = _map(_one_hash_numbers())
    with pytest.raises(ProtocolError, match="share one hash"):
        decode([MAGIC_FRAME, _result_header(flood)], safe=True)
    for answer in _answers(_result_header(flood)):
        assert isinstance(answer, ProtocolError) and "share one hash" in str(answer), answer
    done = (
        hot.DONE_PREFIX
        + b"".join(map(msgpack.packb, ["s", "j", 0]))
        + b"\x81\x00"
        + flood
        + msgpack.packb(b"x")
        + b"\x80\x90"
    )
    assert hot.read_done_header(done) is None
    with pytest.raises(ProtocolError, match="share one hash"):
        decode([MAGIC_FRAME, done], unpickle=False)
    exec_ = _header(
        *map(msgpack.packb, ["exec", "s", "j", "d", msgpack.ExtType(TUPLE, b"\x91\x00")]),
        flood,
        *map(msgpack.packb, [msgpack.ExtType(TUPLE, b"\x90"), 0.0]),
    )
    assert hot.read_exec([MAGIC_FRAME, exec_]) is None
    with pytest.raises(ProtocolError, match="share one hash"):
        decode([MAGIC_FRAME, exec_], unpickle=False)


def test_answers_of_long_maps_of_ordinary_keys_still_read_alike() -> None:
    """A map of more than MAX_SAME_HASH ordinary keys leaves the short path and reads as
    decode reads it; one of MAX_SAME_HASH (a result of 32 ranks) stays on it."""
    from mpl.wire.result_read import RESULT_HEAD, answer_fields

    for n in (32, 33, 500):
        keys = [i * 7 for i in range(n)] + [float(i) + 0.5 for i in range(n)]
        header = _result_header(_map(keys))
        want = decode([MAGIC_FRAME, header], safe=True)
        assert isinstance(want, JobResult)
        for got in _answers(header):
            values = got.values if isinstance(got, JobResult) else got[2]
            assert values == want.values == {0: {0: dict.fromkeys(keys, 0)}}
    by_rank = b"\xde\x00\x20" + b"".join(msgpack.packb(r) + b"\x01" for r in range(32))
    header = RESULT_HEAD + msgpack.packb("j1") + b"\x81\x00" + by_rank + b"\xc0\xc2\x80\x80"
    head = RESULT_HEAD + msgpack.packb("j1")
    assert answer_fields(MAGIC_FRAME + header, head, safe=True, alone=True) is not None
