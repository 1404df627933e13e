"""A ``Sealed`` record whose parts hold an array where a ciphertext goes (a hostile
broker's answer to a driver, or its Exec to a worker: the safe decode builds arrays) is
refused as unauthenticated (``mpl.wire.seal_record.check_record`` takes flat byte buffers
only), never handed to the cipher, whose TypeError reached the driver as such and the worker
as an internal error. Found in review; older than wire v4."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_seal_counts import _driver_and_nodes
from test_sealed_broker import Setup

import mpl.driver as mp
from mpl.wire.codec import encode
from mpl.wire.errors import AuthenticationError, ProtocolError
from mpl.wire.jobs import Exec, JobResult
from mpl.wire.record import Record
from mpl.wire.result_read import read_answer
from mpl.wire.sealed import Sealed


@pytest.mark.parametrize("part", [np.ones(2), np.ones((2, 8))])
def test_a_forged_sealed_record_with_an_array_part_is_refused_as_unauthenticated(
    part: np.ndarray,
) -> None:
    driver, _ = _driver_and_nodes()
    forged = Sealed("node:n0", os.urandom(16), [], [part])
    answer = read_answer(encode(JobResult("j", {0: {0: forged}})), safe=True)
    assert type(answer) is JobResult
    assert type(answer.values[0][0].parts[0]) is np.ndarray  # the broker's array, decoded
    with pytest.raises((AuthenticationError, ProtocolError)):
        driver.opened("s", "j", answer.values)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path, True)
    try:
        yield s
    finally:
        s.close()


@pytest.mark.daemons
def test_a_hostile_broker_forging_array_parts_meets_authentication_errors_only(
    setup: Setup,
) -> None:
    """Real daemons behind a broker whose ROUTER a tap alters: the Exec to rank 0 carries
    a forged ``Sealed`` with an array part (the worker should refuse it as it refuses any
    forgery: a protocol error, no internal one), then a JobResult does (the driver should
    raise AuthenticationError)."""
    forged = Sealed("driver:analyst", os.urandom(16), [], [np.ones(2)])

    def forge_exec(msg: Record) -> Record | None:
        if isinstance(msg, Exec) and 0 in msg.bindings:
            return dataclasses.replace(msg, bindings={0: forged})
        return None

    def forge_result(msg: Record) -> Record | None:
        if isinstance(msg, JobResult) and msg.values:
            fake = Sealed("node:node0", os.urandom(16), [], [np.ones(2)])
            return dataclasses.replace(msg, values={0: {0: fake}})
        return None

    worker = setup.workers[0]
    with setup.ctx:
        one = mp.device("P0")(lambda: 1)
        assert mp.fetch(one()) == 1  # warm
        before = worker.stats()
        setup.tap.alter = forge_exec
        with pytest.raises(mp.AuthenticationError):
            one()
        setup.tap.alter = forge_result
        caught: BaseException | None = None
        try:
            mp.fetch(one())
        except BaseException as exc:  # what the driver raises for it
            caught = exc
        setup.tap.alter = None
        after = worker.stats()
    assert after["internal_errors"] == before["internal_errors"]
    assert after["protocol_errors"] > before["protocol_errors"]
    assert isinstance(caught, mp.AuthenticationError), repr(caught)
