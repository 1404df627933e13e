"""End-to-end sealing (``mpl.wire.seal``) as pure functions, and records the broker routes
without knowing them (``OpaqueRecord``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import zmq
from helpers import decoded_as, sealed_record

from mpl.wire import decode, encode, seal_contexts
from mpl.wire.decoder import OpaqueRecord
from mpl.wire.errors import AuthenticationError, ProtocolError
from mpl.wire.seal import CHUNK, Sealer
from mpl.wire.sealed import BOX_MAGIC, Sealed, is_sealed
from mpl.wire.sessions import Reply
from mpl.wire.shares import SpuShare


def _keys() -> tuple[str, str]:
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


@pytest.fixture(scope="module")
def pair() -> tuple[Sealer, Sealer, Sealer]:
    """A driver, node0, and an outsider whose key node0's spec does not list."""
    drv, node, evil = _keys(), _keys(), _keys()
    driver = Sealer(drv[1], "driver:analyst", {"node:node0": node[0]})
    worker = Sealer(node[1], "node:node0", {"driver:analyst": drv[0]})
    outsider = Sealer(evil[1], "driver:analyst", {"node:node0": node[0]})
    return driver, worker, outsider


def _through_wire(sealed: Sealed | bytes) -> Any:
    """As the recipient gets it: through the broker's opaque decode and a full decode."""
    routed = decode(encode(Reply(1, sealed)), unpickle=False)
    value = decoded_as(Reply, encode(routed)).value
    assert is_sealed(value)
    return value


def test_values_round_trip_through_an_opaque_broker(pair: tuple[Sealer, ...]) -> None:
    driver, worker, _ = pair
    big = np.arange(3 * CHUNK // 8 + 5, dtype=np.float64)  # 4 pieces, the last one short
    value = {"big": big, "small": np.int32(7), "text": "hi", "n": 1 << 80, "empty": b""}
    sealed = sealed_record(worker.seal(value, "driver:analyst", "done|s|j|0"))
    assert len(sealed.parts) == 1 + 4  # the header (small values inline), the array in pieces
    who, opened = driver.open(_through_wire(sealed), "done|s|j|0", sender="node:node0")
    assert who == "node:node0"
    assert np.array_equal(opened["big"], big) and opened["big"].dtype == big.dtype
    assert opened["small"] == np.int32(7) and opened["n"] == 1 << 80 and opened["empty"] == b""
    # the ciphertext holds none of the plaintext
    marker = np.full(4096, 1234.5678).tobytes()
    box = sealed_record(worker.seal(np.full(4096, 1234.5678), "driver:analyst", "done|s|j|1"))
    assert not any(marker[:64] in memoryview(p).tobytes() for p in box.parts)


@pytest.mark.parametrize("where", ["header", "piece", "salt", "drop", "swap"])
def test_any_alteration_fails_authentication(pair: tuple[Sealer, ...], where: str) -> None:
    driver, worker, _ = pair
    sealed = sealed_record(
        worker.seal(np.arange(CHUNK // 4, dtype=np.float64), "driver:analyst", "ctx")
    )
    parts = [bytearray(memoryview(p).tobytes()) for p in sealed.parts]
    salt, sizes = sealed.salt, sealed.sizes
    if where == "header":
        parts[0][-1] ^= 1
    elif where == "piece":
        parts[2][100] ^= 0x80
    elif where == "salt":
        salt = bytes(16)
    elif where == "drop":
        parts.pop()
    else:
        parts[1], parts[2] = parts[2], parts[1]
    bad = Sealed(sealed.sender, salt, sizes, parts)
    with pytest.raises(AuthenticationError):
        driver.open(bad, "ctx")


def _renamed(sealed: Sealed | bytes, sender: str) -> Sealed | bytes:
    """``sealed`` claiming another sender, its ciphertext untouched."""
    if isinstance(sealed, Sealed):
        return Sealed(sender, sealed.salt, sealed.sizes, sealed.parts)
    start = len(BOX_MAGIC) + 1
    name = sender.encode()
    return BOX_MAGIC + bytes([len(name)]) + name + sealed[start + sealed[start - 1] :]


@pytest.mark.parametrize("form", ["compact", "record"])
def test_context_sender_and_key_are_all_bound(pair: tuple[Sealer, ...], form: str) -> None:
    driver, worker, outsider = pair
    if form == "compact":
        sealed: Sealed | bytes = driver.seal([1, 2, 3], "node:node0", "exec|s|job1|d", safe=False)
        assert type(sealed) is bytes and is_sealed(sealed)
    else:
        sealed = driver.seal_record([1, 2, 3], "node:node0", "exec|s|job1|d", safe=False)
    assert worker.open(sealed, "exec|s|job1|d", safe=False)[1] == [1, 2, 3]
    with pytest.raises(AuthenticationError, match="replayed"):
        worker.open(sealed, "exec|s|job2|d", safe=False)  # replayed into another job
    with pytest.raises(AuthenticationError, match="claims to be sealed by"):
        worker.open(sealed, "exec|s|job1|d", sender="driver:other")
    # a key the spec does not pin, even under a listed name, opens nothing
    forged = outsider.seal([6, 6, 6], "node:node0", "exec|s|job1|d", safe=False)
    with pytest.raises(AuthenticationError):
        worker.open(forged, "exec|s|job1|d", safe=False)
    with pytest.raises(AuthenticationError, match="does not list"):
        worker.open(_renamed(sealed, "driver:mallory"), "exec|s|job1|d")
    with pytest.raises(AuthenticationError, match="expected a sealed payload"):
        worker.open([1, 2, 3], "exec|s|job1|d")


def test_a_pickle_sealed_by_a_listed_driver_is_refused_when_safe(
    pair: tuple[Sealer, ...],
) -> None:
    driver, worker, _ = pair
    sealed = driver.seal(lambda: 1, "node:node0", "ctx", safe=False)
    with pytest.raises(ProtocolError, match="pickled value"):
        worker.open(sealed, "ctx", safe=True)


def test_broker_routes_records_it_does_not_know() -> None:
    """The broker never imports the share module (numpy): a share nested in a reply passes
    through it opaque and arrives intact (it used to be 'unknown message tag')."""
    share = SpuShare(b"m" * 27, [bytes(range(256)) * 300], (2, 3), "float64")
    frames = encode(Reply(5, {"x": share, "also": [share]}))
    from mpl.wire import record

    saved = record.Record._registry.pop("spushare")  # as in the broker: tag unknown
    try:
        routed = decoded_as(Reply, frames, unpickle=False)
        assert isinstance(routed.value["x"], OpaqueRecord)
        again = encode(routed)
        with pytest.raises(ProtocolError, match="unknown message tag"):
            decode(again)  # a process that decodes values must know every tag it accepts
    finally:
        record.Record._registry["spushare"] = saved
    value = decoded_as(Reply, again).value
    assert value["x"] == share and value["also"] == [share]


def test_worker_refuses_a_replayed_or_rerouted_job(pair: tuple[Sealer, ...]) -> None:
    """A worker opens a job's bindings once, for exactly the ranks, inline outputs and
    deadline the driver sealed."""
    from mpl.wire.jobs import Exec, Failed
    from mpl.wire.seal import exec_context
    from mpl.worker.sealing import WorkerSeal

    driver, worker, _ = pair
    seal = WorkerSeal(worker, 0)
    context = exec_context("s", "j1", "d", (0, 1), (0,), 5.0)
    sealed = driver.seal([None], "node:node0", context, safe=False)
    opened, answer = seal.inbound(Exec("s", "j1", "d", (0, 1), {0: sealed}, (0,), 5.0))
    assert answer is None and isinstance(opened, Exec) and opened.bindings == {0: [None]}
    opened, answer = seal.inbound(Exec("s", "j1", "d", (0, 1), {0: sealed}, (0,), 5.0))
    assert opened is None and isinstance(answer, Failed) and "replay" in answer.error.message
    for ranks, inline, timeout in (((0,), (0,), 5.0), ((0, 1), (), 5.0), ((0, 1), (0,), 60.0)):
        fresh = WorkerSeal(worker, 0)  # a worker that never saw j1: the seal itself refuses
        opened, answer = fresh.inbound(Exec("s", "j1", "d", ranks, {0: sealed}, inline, timeout))
        assert opened is None and isinstance(answer, Failed)
        assert answer.error.kind == "AuthenticationError", answer.error


def test_large_arrays_are_sealed_and_opened_without_an_extra_copy(
    pair: tuple[Sealer, ...],
) -> None:
    """Sealing allocates the ciphertext and nothing more; opening allocates the plaintext
    and nothing more (each piece goes straight from one buffer to the other)."""
    import tracemalloc

    driver, worker, _ = pair
    size = 32 * 1024 * 1024
    value = np.ones(size // 8)
    tracemalloc.start()
    try:
        sealed = worker.seal(value, "driver:analyst", "big")
        _, sealing_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        _, opened = driver.open(sealed, "big")
        _, opening_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sealed_record(sealed).parts) == 1 + size // CHUNK
    assert sealing_peak < 1.1 * size, sealing_peak / size
    assert opening_peak - base < 1.1 * size, (opening_peak - base) / size
    assert np.array_equal(opened, value)


def test_the_hot_paths_context_check_refuses_a_changed_context_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sealing hot paths write Exec and Done contexts out; pin_contexts (run at their
    import) refuses to let them if wire.seal_contexts writes either differently."""
    seal_contexts.pin_contexts("a hot path")  # as written today: accepted
    monkeypatch.setattr(seal_contexts, "done_context", lambda s, j, i: f"done|{s}|{j}#{i}")
    with pytest.raises(ImportError, match="a hot path writes Done contexts"):
        seal_contexts.pin_contexts("a hot path")
    monkeypatch.undo()
    monkeypatch.setattr(seal_contexts, "exec_context", lambda *a: "exec|" + "|".join(map(str, a)))
    with pytest.raises(ImportError, match="a hot path writes Exec contexts"):
        seal_contexts.pin_contexts("a hot path")
