"""Wire versioning: persisted files have a format version of their own, so the wire's
``VERSION`` can change (it did: 2, the stats blob) and files written before still load; a
peer of another wire version gets a ``ProtocolError`` naming both versions, never a hang.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from helpers import fake_broker, raw_broker
from test_hot_path import Raw

from mpl.driver.client import Client
from mpl.wire.codec import MAGIC_FRAME, VERSION, decode, encode
from mpl.wire.control import Refused
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import Lit
from mpl.wire.persist import (
    RECORD_MAGIC,
    SYMBOL_MAGIC,
    dumps,
    loads,
    split_symbol,
    symbol_chunks,
)
from mpl.wire.sessions import OpenSession, SessionOpened, SymbolInfo

# Written by bac702e's mpl.wire.persist (wire version 1, before persisted files had their
# own version): symbol_chunks(SymbolInfo("kept", "P0", (0,), True, {"dtype": "float64",
# "shape": [3]}), Lit(np.arange(3.0))), and dumps(Lit({"a": [1, 2.5, "x"]})).
OLD_SYMBOL = bytes.fromhex(
    "4d50530144000000000000004d504c0104000000000000004d504c012c0000000000000096a67379"
    "6d626f6ca46b657074a25030d5049100c382a56474797065a7666c6f61743634a573686170659103"
    "4d504c0104000000000000004d504c010f0000000000000092a36c6974d70193a33c663891030018"
    "000000000000000000000000000000000000000000f03f0000000000000040"
)
OLD_RECORD = (
    b"MPL\x01\x04\x00\x00\x00\x00\x00\x00\x00MPL\x01\x15\x00\x00\x00\x00\x00\x00\x00\x92\xa3"
    b"lit\x81\xa1a\x93\x01\xcb@\x04\x00\x00\x00\x00\x00\x00\xa1x"
)
OTHER = VERSION - 1  # the version before (3: its magic a frame of its own, this one 4)


def test_files_written_before_persisted_files_had_a_version_still_load() -> None:
    info, value = split_symbol(OLD_SYMBOL)
    assert info == SymbolInfo("kept", "P0", (0,), True, {"dtype": "float64", "shape": [3]})
    assert isinstance(value, Lit) and np.array_equal(value.value, np.arange(3.0))
    old = loads(OLD_RECORD)
    assert isinstance(old, Lit) and old.value == {"a": [1, 2.5, "x"]}


def test_new_files_carry_their_own_format_version_not_the_wires() -> None:
    data = dumps(Lit({"a": [1, 2.5, "x"]}))
    assert data.startswith(RECORD_MAGIC) and MAGIC_FRAME not in data
    assert loads(data) == Lit({"a": [1, 2.5, "x"]})
    info = SymbolInfo("kept", "P0", (0,), True, {})
    whole = b"".join(bytes(c) for c in symbol_chunks(info, Lit(np.arange(3.0))))
    assert whole.startswith(SYMBOL_MAGIC)
    head, value = split_symbol(whole)
    assert head == info and isinstance(value, Lit)
    assert np.array_equal(value.value, np.arange(3.0))
    later = RECORD_MAGIC[:3] + bytes([RECORD_MAGIC[3] + 1]) + data[len(RECORD_MAGIC) :]
    with pytest.raises(ProtocolError, match="format version 2: this mpl reads versions up to 1"):
        loads(later)


def test_a_message_or_batch_of_another_wire_version_names_both_versions() -> None:
    frames = encode(OpenSession(1, "", 60.0, "x"))
    for magic in (b"MPL" + bytes([OTHER]), b"MPB" + bytes([OTHER])):
        with pytest.raises(ProtocolError) as caught:
            decode([magic, *frames[1:]])
        said = str(caught.value)
        assert f"wire version {OTHER} is not supported" in said
        assert f"this mpl speaks wire version {VERSION}" in said


def test_a_broker_answers_a_peer_of_another_version_naming_both_and_serves_on() -> None:
    with raw_broker(2, Raw) as (broker, raw):
        old = raw()
        header = encode(OpenSession(1, "", 60.0, "old"))[1]
        old.sock.send_multipart([b"MPL" + bytes([OTHER]), header])
        refused, frames = old.wait_for(Refused)
        assert isinstance(refused, Refused)
        assert f"wire version {OTHER} is not supported" in refused.error.message
        assert f"wire version {VERSION}" in refused.error.message
        # the answer is in the broker's version: the old peer's codec names both as well
        assert frames[0] == MAGIC_FRAME
        assert broker.state.counters["protocol_errors"] == 1
        new = raw()
        new.send(OpenSession(2, "", 60.0, "new"))
        opened, _ = new.wait_for(SessionOpened)
        assert isinstance(opened, SessionOpened)


def test_a_driver_whose_broker_speaks_another_version_fails_at_once_naming_both() -> None:
    """A broker of another wire version (faked: a ROUTER that answers every message in
    that version) fails the driver's first call with the reason, not a timeout."""

    def answer(router: zmq.Socket[Any], peer: bytes, _: list[bytes]) -> None:
        old = msgpack.packb(["refused", "whatever it says"], use_bin_type=True)
        router.send_multipart([peer, b"MPL" + bytes([OTHER]), old])

    with fake_broker(answer) as address:
        client = Client(address, timeout=30.0)
        try:
            with pytest.raises(ProtocolError) as caught:
                client.open_session("")
            said = str(caught.value)
            assert f"wire version {OTHER} is not supported" in said
            assert f"wire version {VERSION}" in said
        finally:
            client.close()
