"""Review w33: a copy shared by fingerprint gives a session exactly what it sent.

The broker (sessions' own specs) and each worker (sessions' runtime_info) keep one copy of
equal values, found by ``mpl.wire.fingerprint``, and hand that copy to every session that
brought an equal one. Python's equality is looser than what a session can see: maps equal
in another key order, a numpy ``float64`` equal to the float it subclasses. The
fingerprint took both as the same, so a session got another session's copy (another
driver's, on a secure broker): its kernels and its driver saw that session's key order or
types instead of its own, and a driver could tell, by the order it got back, that another
driver had opened a session with a spec equal to a guess. Now such values are not shared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpl.broker.session_specs import SessionSpecs
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec
from mpl.wire.codec import decode, encode
from mpl.wire.fingerprint import fingerprint
from mpl.wire.sessions import OpenSession, Reply, SessionOpened, SessionRuntime
from mpl.worker.session_runtime import SessionRuntimes

_CLUSTER = ClusterSpec.simple(2, enable_spu=False)


def test_equal_maps_in_another_order_or_of_subclassed_types_have_other_fingerprints() -> None:
    assert fingerprint({"a": 1, "b": [2]}) == fingerprint({"a": 1, "b": [2]})
    assert fingerprint({"a": 1, "b": [2]}) != fingerprint({"b": [2], "a": 1})
    assert fingerprint({"a": {"x": 1, "y": 2}}) != fingerprint({"a": {"y": 2, "x": 1}})
    assert fingerprint({"v": np.float64(1.5)}) != fingerprint({"v": 1.5})
    assert fingerprint({"v": np.str_("x")}) != fingerprint({"v": "x"})
    assert fingerprint({"v": np.bytes_(b"x")}) != fingerprint({"v": b"x"})


def test_a_worker_gives_each_session_its_own_order_and_types() -> None:
    runtimes = SessionRuntimes(0, lambda: {})
    first = {"op_bindings": {"a": "x:y", "b": "x:z"}, "tags": ["p"], "v": np.float64(1.5)}
    runtimes.open(SessionRuntime("a", 1, first))
    mine = {"tags": ["p"], "op_bindings": {"b": "x:z", "a": "x:y"}, "v": 1.5}
    runtimes.open(SessionRuntime("b", 2, mine))
    seen = runtimes.of("b")
    assert list(seen) == ["tags", "op_bindings", "v"]
    assert list(seen["op_bindings"]) == ["b", "a"]
    assert type(seen["v"]) is float


def _spec(order: list[str]) -> dict[str, Any]:
    spec = _CLUSTER.to_dict()
    for node in spec["nodes"]:
        node["runtime_info"] = {key: key for key in order}  # after version, platform...
    return spec


def test_a_broker_gives_each_session_its_own_spec_order() -> None:
    """Two drivers (the second guessing the first's spec), each opening a session with
    ``cluster=``: the second gets back the order it sent, not the first's."""
    state = BrokerState(_CLUSTER, now=0.0, broker_id="B")
    answers = []
    for n, order in enumerate((["k1", "k2"], ["k2", "k1"])):
        msg = decode(encode(OpenSession(n + 1, f"s{n}", 60.0, f"c{n}", cluster=_spec(order))))
        (out,) = state.handle(f"drv:d{n}/1".encode(), msg, 0.1)
        assert isinstance(out.msg, SessionOpened), out.msg
        answers.append(out.msg.cluster)
    second = answers[1]["nodes"][0]["runtime_info"]
    assert [k for k in second if k.startswith("k")] == ["k2", "k1"]


def test_the_specs_table_still_shares_one_copy_of_equal_specs() -> None:
    specs = SessionSpecs(10**6)
    spec = _spec(["k2", "k1"])
    kept = specs.keep(spec, "alice")
    again = specs.keep(_spec(["k2", "k1"]), "bob")
    assert not isinstance(kept, str) and not isinstance(again, str)
    assert again[1] == kept[1] and again[0] is kept[0]
    weight = specs.weight
    other = specs.keep(_spec(["k1", "k2"]), "bob")
    assert not isinstance(other, str) and other[1] != kept[1]
    assert specs.weight == 2 * weight


def test_a_spec_nested_too_deep_is_refused_saying_so() -> None:
    """The wire lets a value nest 100 deep; the fingerprint stops at 64, and the broker
    refused such a spec saying it held "a value of another type", which it did not."""
    state = BrokerState(_CLUSTER, now=0.0, broker_id="B")
    spec = _CLUSTER.to_dict()
    deep: list[Any] = []
    for _ in range(70):
        deep = [deep]
    spec["devices"][next(iter(spec["devices"]))]["config"] = {"deep": deep}
    msg = decode(encode(OpenSession(1, "s0", 60.0, "c0", cluster=spec)))
    (out,) = state.handle(b"drv:d0/1", msg, 0.1)
    assert isinstance(out.msg, Reply) and out.msg.error is not None, out.msg
    assert "deeper" in out.msg.error.message


def test_a_kernel_changing_its_runtime_info_changes_no_other_sessions() -> None:
    """Sessions bringing equal runtime_info share one kept copy: what a kernel of one
    gets from ``runtime_info()`` was a shallow copy, so a kernel changing a list or
    op_bindings in it changed every other session's (another driver's among them)."""
    from mpl.worker import kernel_table

    runtimes = SessionRuntimes(0, lambda: {})
    info = {"op_bindings": {"a": "x:y"}, "tags": ["p"]}
    for session in ("a", "b"):
        runtimes.open(SessionRuntime(session, 1, {"op_bindings": {"a": "x:y"}, "tags": ["p"]}))
    token = kernel_table._RUNTIME_INFO.set(runtimes.of("a"))  # as a kernel of "a" runs
    try:
        mine = kernel_table.runtime_info()
        mine["op_bindings"]["a"] = "evil:kernel"
        mine["tags"].append("changed")
    finally:
        kernel_table._RUNTIME_INFO.reset(token)
    assert runtimes.of("b") == info
