"""Red team w33 (R33-6): a header of tiny extension values costs what its containers may.

The counting decoder bounds what one header may build by its lists and dicts
(``MAX_CONTAINERS``, a Python call each: about 0.3 s for the most a header may hold). A
BIGINT, a complex or (in the broker's opaque mode) a numpy scalar is an extension value
msgpack hands to ``Decoder.ext``, a Python call each too, but was not counted: a BIGINT is
3 bytes on the wire, so a 16 MiB header (``MAX_HEADER_BYTES``) of them made 5.6 million
calls, 1.7 s of CPU per message, in the broker's only loop, from any sender it reads (a
listed driver, a party's worker; in plaintext any local process), before it refused the
message for what it was. Two connections sending such messages back to back held the loop
past a worker's 3 s of missed heartbeats. Each such value now counts as a container: at
most ``MAX_CONTAINERS`` calls, and the header is refused at the bound.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from helpers import one, wait_until

import mpl.driver as mp
from mpl.wire import decoder
from mpl.wire.codec import MAGIC_FRAME, decode, to_wire
from mpl.wire.errors import ProtocolError
from mpl.wire.limits import MAX_CONTAINERS, MAX_HEADER_BYTES
from mpl.wire.safe_values import COMPLEX

_EXTS = {
    "bigint": msgpack.ExtType(decoder.BIGINT, b"\x01"),
    "complex": msgpack.ExtType(COMPLEX, bytes(16)),
    "scalar": msgpack.ExtType(decoder.SCALAR, msgpack.packb(["<f8", bytes(8)])),
}


def _flood(ext: msgpack.ExtType, tag: str = "hb") -> bytes:
    """A header as long as a receiver takes, made of ``ext`` values (a record ``tag``'s
    fields would be checked only after all of them are built)."""
    per = len(msgpack.packb(ext))
    n = (MAX_HEADER_BYTES - 64) // per
    chunk = 1 << 22  # msgpack's per-array bound in the decoder (MAX_HEADER_ITEMS)
    parts = [[ext] * min(chunk, n - i) for i in range(0, n, chunk)]
    header: bytes = msgpack.packb([tag, *parts])
    assert len(header) <= MAX_HEADER_BYTES
    return header


@pytest.mark.parametrize("kind", sorted(_EXTS))
@pytest.mark.parametrize("unpickle", [False, True], ids=["broker", "worker"])
def test_a_header_of_extension_values_makes_at_most_the_bounds_calls(
    monkeypatch: pytest.MonkeyPatch, kind: str, unpickle: bool
) -> None:
    calls = [0]
    ext = decoder.Decoder.ext

    def counted(self: decoder.Decoder, code: int, data: bytes) -> Any:
        calls[0] += 1
        return ext(self, code, data)

    monkeypatch.setattr(decoder.Decoder, "ext", counted)
    with pytest.raises(ProtocolError, match=f"more than {MAX_CONTAINERS}"):
        decode([MAGIC_FRAME, _flood(_EXTS[kind])], unpickle=unpickle)
    assert calls[0] <= MAX_CONTAINERS + 1  # before: 5.6 million BIGINTs, all built


def test_a_real_broker_stops_reading_such_a_header_at_the_bound(
    make_cluster: Callable[..., Any],
) -> None:
    """Sent from a raw socket to a real broker: refused at the bound (before, read whole
    and refused for its fields), and the broker goes on serving."""
    cluster = make_cluster("tcp", world_size=1)
    zctx: zmq.Context[Any] = zmq.Context()
    raw = zctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    try:
        raw.connect(cluster.address)
        raw.send_multipart(to_wire([MAGIC_FRAME, _flood(_EXTS["bigint"])]))
        log = Path(cluster.impl.run_dir) / "broker.log"
        wait_until(
            lambda: log.exists() and "bad message" in log.read_text(errors="replace"),
            60,
            "the broker to refuse the message",
        )
        assert f"more than {MAX_CONTAINERS}" in log.read_text(errors="replace")
        with mp.connect(cluster.address) as ctx:
            try:
                assert mp.fetch(mp.device("P0")(one)()) == 1
            finally:
                ctx.close()
    finally:
        raw.close()
        zctx.term()
