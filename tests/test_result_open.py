"""The driver's opener of a job's sealed values (``mpl.wire.result_open``), which opens a
known epoch's box itself (``box_open`` written out): every value opens as ``Sealer.open``
opens it, and every altered, cut, extended or replayed box is refused as it refuses it."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import sealer_pair

from mpl.wire.errors import AuthenticationError
from mpl.wire.result_open import result_opener
from mpl.wire.seal import done_context
from mpl.wire.seal_box import ETM_MAX

VALUES: list[Any] = [
    7,  # one byte of plaintext: its value from a table
    None,
    True,
    False,
    -5,
    -32,  # the fixints' ends
    127,
    "",  # one byte of plaintext the table does not hold: read by the codec
    1000,  # a few bytes
    2.5,
    "short text",
    "y" * (ETM_MAX - 8),  # near the largest BLAKE2b box
    "z" * (ETM_MAX + 40),  # AES-256-GCM
]


def _unknown(rank: int) -> str:
    raise AuthenticationError(f"rank {rank} has no node here")


def _setup() -> tuple[Any, Any, Any]:
    driver, node = sealer_pair()
    opener = result_opener(driver, {0: "node:n0"}, "s", True, _unknown)

    def box(job: str, value: Any, index: int = 0) -> Any:
        return node.seal(value, "driver:a", done_context("s", job, index))

    assert opener("j0", {0: {0: box("j0", 1)}}) == {0: {0: 1}}  # its epoch learnt: known
    return driver, opener, box


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_a_known_epochs_box_opens_as_sealer_open_opens_it(value: Any) -> None:
    driver, opener, box = _setup()
    for i, index in enumerate((0, 3, 20)):  # a common output index and an uncommon one
        job = f"j{i + 1}"
        sealed = box(job, value, index)
        expected = driver.open(sealed, done_context("s", job, index), sender="node:n0")[1]
        assert expected == value
        assert opener(job, {index: {0: sealed}}) == {index: {0: value}}


@pytest.mark.parametrize("value", [7, "", 1000, "short text", "z" * (ETM_MAX + 40)])
def test_every_altered_cut_extended_or_replayed_box_is_refused(value: Any) -> None:
    driver, opener, box = _setup()
    sealed = box("j1", value)
    context = done_context("s", "j1", 0)
    forged = [
        *(sealed[:at] + bytes([sealed[at] ^ 1]) + sealed[at + 1 :] for at in range(len(sealed))),
        sealed[:-1],
        sealed + b"\x00",
        sealed[:-17],
    ]
    for bad in forged:
        with pytest.raises(AuthenticationError):
            driver.open(bad, context, sender="node:n0")
        with pytest.raises(AuthenticationError):
            opener("j1", {0: {0: bad}})
    with pytest.raises(AuthenticationError):  # another job's, or another output's
        opener("j2", {0: {0: sealed}})
    with pytest.raises(AuthenticationError):
        opener("j1", {1: {0: sealed}})
    assert opener("j1", {0: {0: sealed}}) == {0: {0: value}}  # the genuine one still opens
