"""Review w32 B4: a worker looked up an equal runtime_info to share by a linear search.

``worker/session_runtime.py`` kept copies in buckets by (weight, number of keys) and
compared the newcomer with every copy in its bucket. A broker announcing many sessions
whose runtime_info differ only in a value's text (the same weight and keys) put them all
in one bucket: each open then compared against every one kept, the square of their
number over all opens, on the worker's I/O thread. Now an equal copy is found by its
fingerprint (``mpl.wire.fingerprint``), one hash lookup whatever was kept before.

The comparisons are counted by values that count their own ``==``.
"""

from __future__ import annotations

from mpl.wire.fingerprint import fingerprint
from mpl.wire.sessions import SessionRuntime
from mpl.worker.session_runtime import SessionRuntimes


class _Counted(str):
    """A text value that counts how often it is compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_an_open_compares_with_no_kept_runtime_info_of_the_same_shape() -> None:
    runtimes = SessionRuntimes(0, lambda: {})
    kept = 2000  # all of one weight and one key: one bucket, before
    for n in range(kept):
        answer = runtimes.open(SessionRuntime(f"s{n}", n + 1, {"k": _Counted(f"{n:06d}")}))
        assert answer is not None and answer.error is None
    _Counted.compared = 0
    answer = runtimes.open(SessionRuntime("last", 9999, {"k": _Counted("last!!")}))
    assert answer is not None and answer.error is None
    assert _Counted.compared <= 2, f"{_Counted.compared} comparisons for one open"
    assert len(runtimes) == kept + 1


def test_equal_runtime_info_still_shares_one_copy() -> None:
    runtimes = SessionRuntimes(0, lambda: {})
    info = {"op_bindings": {"a": "x:y"}, "tags": ["p", 1, 2.5, None, True, b"z"]}
    runtimes.open(SessionRuntime("a", 1, info))
    weight = runtimes.weight
    # equal and in the same order (another order is not shared: test_rev33b_fingerprint_sharing)
    runtimes.open(SessionRuntime("b", 2, {"op_bindings": {"a": "x:y"}, "tags": list(info["tags"])}))
    assert runtimes.weight == weight  # one copy, counted once
    runtimes.closed("a")
    assert runtimes.weight == weight and runtimes.of("b") == info
    runtimes.closed("b")
    assert runtimes.weight == 0


def test_a_fingerprint_tells_apart_what_is_not_equal() -> None:
    """Equal values, in the same key order, have one fingerprint; values that differ in
    type, framing or order do not (sharing them would give a session another's
    runtime_info)."""
    assert fingerprint({"a": 1, "b": [2]}) == fingerprint({"a": 1, "b": [2]})
    assert fingerprint({"a": 1, "b": [2]}) != fingerprint({"b": [2], "a": 1})
    different = [
        {"a": "1"}, {"a": 1}, {"a": 1.0}, {"a": True}, {"a": b"1"}, {"a": None},
        {"a": ["1"]}, {"a": ("1",)}, {"a": {"1": None}}, {"ab": ""}, {"a": "b"},
        {"a": ["", ""]}, {"a": [""]}, ["a", "1"], "a1", {"a": -1}, {"a": 2**64},
    ]  # fmt: skip
    prints = [fingerprint(v) for v in different]
    assert None not in prints and len(set(prints)) == len(different)
    assert fingerprint({"a": object()}) is None  # no value of the wire: not shared
