"""Review of w32's trust changes: a pickle in a broker's answer is loaded at most once.

In a ``trusted: true`` cluster a job's answer may carry pickles, and loading one runs its
code: a driver must load each at most once, however its readers get to the answer.

* The short-answer reader (``wire/result_read.py``) reads a short header with a Decoder
  that builds no map of more than ``MAX_SAME_HASH`` keys, and reads a header holding a
  longer one again with a counting Decoder. A pickle before such a map was loaded by the
  first read and again by the second (its author's own note).
* A call waiting for its job's answer (``BrokerCalls._mine``) read an answer it refused
  (a ``ProtocolError``, say an unreferenced buffer frame after the pickle) a second time
  as "anything else" (``_answers``), so its pickles were loaded twice.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from mpl.driver.calls import BrokerCalls
from mpl.driver.job_progress import ProgressBoard
from mpl.wire.codec import MAGIC_FRAME, encode
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import JobResult
from mpl.wire.limits import MAX_SAME_HASH
from mpl.wire.result_read import RESULT_HEAD, answer_fields, read_answer, result_fields

LOADS: list[int] = []  # one entry per pickle of a _Counted loaded in this process


def _loaded() -> int:
    LOADS.append(1)
    return len(LOADS)


class _Counted:
    """A value whose pickle, when loaded, counts itself (its code runs once per load)."""

    def __reduce__(self) -> Any:
        return (_loaded, ())


@pytest.fixture(autouse=True)
def _no_loads_yet() -> None:
    LOADS.clear()


def _answer_with(*values: Any, job: str = "j1") -> list[Any]:
    """A JobResult of ``job`` whose output 0 on rank 0 is ``values``, encoded with pickles
    (as a trusted worker's answer is): ``[magic, header, *buffers]``."""
    return encode(JobResult(job, {0: {0: list(values)}}), safe=False)


def test_a_short_answer_with_a_pickle_before_a_long_map_loads_it_once() -> None:
    long_map = {i: i for i in range(MAX_SAME_HASH + 1)}  # read again by a counting Decoder
    frames = _answer_with(_Counted(), long_map)
    assert len(frames) == 2 and len(frames[1]) < 8192  # the short path's: no buffer frame
    got = read_answer(frames, safe=False)
    assert isinstance(got, JobResult)
    assert got.values[0][0][1] == long_map
    assert len(LOADS) == 1
    head = RESULT_HEAD + msgpack.packb("j1")
    fields = answer_fields(MAGIC_FRAME + frames[1], head, safe=False)
    assert fields is not None and fields[2][0][0][1] == long_map
    assert len(LOADS) == 2  # one more read, one more load
    fields = result_fields(frames, head, safe=False)
    assert fields is not None and len(LOADS) == 3


def test_a_short_answer_with_a_pickle_and_a_buffer_before_a_long_map_loads_it_once() -> None:
    long_map = {i: i for i in range(MAX_SAME_HASH + 1)}
    frames = _answer_with(_Counted(), b"x" * 100_000, long_map)  # bytes: a buffer frame
    assert len(frames) == 3
    got = read_answer(frames, safe=False)
    assert isinstance(got, JobResult) and got.values[0][0][2] == long_map
    assert len(LOADS) == 1


def test_a_short_answer_with_only_short_maps_still_reads_its_pickle() -> None:
    frames = _answer_with(_Counted(), {i: i for i in range(MAX_SAME_HASH)})
    got = read_answer(frames, safe=False)
    assert isinstance(got, JobResult) and got.values[0][0][0] == 1
    assert len(LOADS) == 1


class _Calls(BrokerCalls):
    """The part of a trusted Client that reads its answers, without sockets."""

    def __init__(self) -> None:
        super().__init__()
        self.safe = False  # a trusted cluster: pickles load
        self.progress = ProgressBoard()


def test_an_answer_a_waiting_call_refuses_loads_its_pickle_once() -> None:
    calls = _Calls()
    # the awaited job's answer, whose pickle loads before a buffer frame nothing references
    # makes it refused
    frames = [*_answer_with(_Counted()), b"unreferenced"]
    with pytest.raises(ProtocolError, match="could not be accepted"):
        calls._mine(frames, "j1")  # refused: its job fails at once (w33-limits)
    assert len(LOADS) == 1
    # another job's answer (a late one) read while waiting: the same
    frames = [*_answer_with(_Counted(), job="j0"), b"unreferenced"]
    assert calls._mine(frames, "j1") is None
    assert len(LOADS) == 2
