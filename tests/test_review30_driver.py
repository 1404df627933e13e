"""Review w30 of the driver's speed changes (w30-driver): the opener's written-out
``box_open``, the call site's answer read from its first frame alone, the counts over all
threads, the bounded memory of programs sent and ``Context.jobs`` built from tuples.

Each finding's test fails while the problem exists; what was checked and found sound has
a test that pins it (a differential one for the opener)."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from typing import Any

import pytest
from helpers import sealer_pair

import mpl.driver as mp
from mpl.driver import context, recorder
from mpl.wire.errors import AuthenticationError
from mpl.wire.result_open import result_opener
from mpl.wire.seal import _BOX_HEAD, _BOX_START, _NONCE, done_context
from mpl.wire.seal_box import ETM_MAX

# -- the opener: every box it accepts, Sealer.open accepts, with the same value ----------

_NODE = "node:n0"


def _refuse(rank: int) -> str:
    raise AuthenticationError(f"rank {rank} has no node here")


def _by_sealer(driver: Any, box: bytes, job: str, index: int) -> str:
    try:
        return repr(driver.open(box, done_context("s", job, index), sender=_NODE)[1])
    except AuthenticationError:
        return "refused"


def _by_opener(opener: Any, box: bytes, job: str, index: int) -> str:
    try:
        return repr(opener(job, {index: {0: box}})[index][0])
    except AuthenticationError:
        return "refused"


@pytest.mark.timeout(120)
def test_the_opener_accepts_exactly_what_sealer_open_accepts() -> None:
    """Differential: boxes of every size class (one byte, a few, the largest BLAKE2b box,
    the smallest AES-GCM one, a sealed None's tag alone), each altered byte by byte, cut
    and extended at every length, its parts spliced with another epoch's box of the same
    node, and replayed into other jobs and outputs, are opened by a warm opener (the
    rank's epoch known: its own copy of box_open) exactly as ``Sealer.open`` opens them."""
    rng = random.Random(30)
    driver, node = sealer_pair(node=_NODE)
    _, other_node = sealer_pair(node=_NODE)  # another process's key for the same name
    senders = {0: _NODE}
    opener = result_opener(driver, senders, "s", True, _refuse)

    def box(job: str, value: Any, index: int = 0, by: Any = node) -> Any:
        return by.seal(value, "driver:a", done_context("s", job, index))

    assert opener("warm", {0: {0: box("warm", 1)}}) == {0: {0: 1}}  # its epoch known
    values: list[Any] = [
        7,
        None,
        True,
        1000,
        2.5,
        "x" * (ETM_MAX - 16),  # the codec's header: exactly ETM_MAX bytes of plaintext
        "x" * (ETM_MAX - 15),  # one past it: AES-GCM
    ]
    sealed = [box("j", v) for v in values]
    plain = [len(s) - (s[_BOX_START - 1] + _BOX_HEAD) - _NONCE - 16 for s in sealed]
    assert plain == [1, 0, 1, 3, 9, ETM_MAX, ETM_MAX + 1]  # a None: its tag alone
    other_epoch = box("j", 5, by=sealer_pair(node=_NODE)[1])
    candidates: list[tuple[str, int, bytes]] = []
    for good in sealed:
        candidates.append(("j", 0, good))
        candidates += [("j2", 0, good), ("j", 1, good), ("j", 17, good)]  # replayed
        for at in range(len(good)):
            for mask in (1, 0x80, rng.randrange(1, 256)):
                candidates.append(("j", 0, good[:at] + bytes([good[at] ^ mask]) + good[at + 1 :]))
            candidates.append(("j", 0, good[:at]))  # cut
        for extra in (b"\x00", bytes(16), bytes(rng.randrange(256) for _ in range(40))):
            candidates.append(("j", 0, good + extra))
        # its head with another epoch's nonce and ciphertext, the reverse, its nonce alone
        end = good[_BOX_START - 1] + _BOX_HEAD  # the head's end (the same name: the same)
        candidates.append(("j", 0, good[:end] + other_epoch[end:]))
        candidates.append(("j", 0, other_epoch[:end] + good[end:]))
        nonce = slice(end, end + _NONCE)
        candidates.append(("j", 0, good[:end] + other_epoch[nonce] + good[end + _NONCE :]))
    candidates.append(("j", 0, box("j", 9, by=other_node)))  # a key the spec does not list
    opened = 0
    for job, index, candidate in candidates:
        expected = _by_sealer(driver, candidate, job, index)
        assert _by_opener(opener, candidate, job, index) == expected, (job, index, candidate.hex())
        opened += expected != "refused"
    assert opened == len(values)  # the genuine ones alone
    # the rank's node replaced (another name in the senders the opener reads): its known
    # epoch no longer opens for that rank, as Sealer.open refuses another sender's box
    senders[0] = "node:n9"
    with pytest.raises(AuthenticationError):
        opener("j", {0: {0: sealed[0]}})
    senders[0] = _NODE
    assert opener("j", {0: {0: sealed[0]}}) == {0: {0: 7}}


# -- Context.jobs: read while the pump thread records a job ------------------------------


def test_context_jobs_holds_while_another_thread_records_a_job() -> None:
    """``Context.jobs`` builds a JobRecord per kept row in Python; the submit pump's thread
    appends a row whenever an async job ends (``Context.submit``'s ``record``). A row
    appended between two of those builds made the deque's iterator raise RuntimeError
    ("deque mutated during iteration"), so ``mp.trace`` failed while async jobs ran. The
    append is made at that moment here (from a profile hook, as a thread switch there
    would make it), so the interleaving is the same on every run."""
    sim = mp.Simulator.simple(2)
    try:
        rows = sim._job_rows
        for n in range(3):
            rows.append((f"j{n}", "g", 0.0, 0.0, {}))
        made = 0

        def pump_thread_records(frame: Any, event: str, arg: Any) -> None:
            nonlocal made
            if event == "call" and frame.f_code.co_name == "_make" and made < 2:
                made += 1
                rows.append((f"late{made}", "g", 0.0, 0.0, {}))

        sys.setprofile(pump_thread_records)
        try:
            records = sim.jobs
        finally:
            sys.setprofile(None)
        assert made >= 1
        assert [r.job for r in records][:3] == ["j0", "j1", "j2"]
        assert len(sim.jobs) == 3 + made  # the late rows are kept for the next read
    finally:
        sim.close()


# -- the counts over all threads after a fork ---------------------------------------------


def _held_while_forking(owner: Any, counts: list[int]) -> int:
    """Fork while another thread, counted in ``counts``, holds ``owner._counting`` (as
    between its count and its push); the child's exit code: 0 when it can take the lock
    and its count is its own thread's (none), 3 when not."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with owner._counting:
            counts[0] += 1
            holding.set()
            release.wait(30)
            counts[0] -= 1

    thread = threading.Thread(target=hold)
    thread.start()
    pid = 0
    try:
        assert holding.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: the holding thread does not exist here
            taken = owner._counting.acquire(timeout=2)
            os._exit(0 if taken and counts[0] == 0 else 3)
    finally:
        release.set()
        thread.join(30)
    deadline = time.monotonic() + 30
    ended = False
    try:
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ended = True
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        raise AssertionError("the forked child did not end")
    finally:
        if not ended:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
@pytest.mark.parametrize(
    ("owner", "counts"),
    [(context, context.ENTERED), (recorder, recorder.TRACING)],
    ids=["ENTERED", "TRACING"],
)
def test_a_child_forked_while_another_thread_counts_can_count(owner: Any, counts: Any) -> None:
    """The counts are changed under a module lock. A process forked while another thread
    held it (entering or leaving ``with ctx:`` or a trace) had a copy nobody would release:
    the child's first ``with ctx:`` (or trace) blocked for ever. The child's counts are
    its own thread's: the others' contexts and traces are not in it."""
    assert _held_while_forking(owner, counts) == 0
    assert counts[0] == 0


# -- the call site's answer read from its first frame alone -------------------------------


@pytest.mark.timeout(60)
def test_an_answer_with_frames_after_it_is_the_jobs_and_the_frames_are_refused_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hostile broker (the in-process one, its sends to the driver wrapped) sends a
    trivial job's genuine answer with one frame more in the same message. ``decode`` (and
    the driver before the alone read) refuses such a message: every buffer frame must be
    referenced by the header. Finding 3 (low), kept by design: the call site reads its
    answer's first frame alone (asking whether more follow would cost a socket query a
    job), so it takes the genuine answer; the frame after it is read as a message of its
    own and refused, and never becomes the next job's answer (ids are random, and it holds
    none). A broker can send such a frame on its own at any time; this gives it nothing
    more."""
    import zmq

    import mpl.broker.outbox as outbox
    from mpl.wire.codec import MAGIC_FRAME
    from mpl.wire.result_read import RESULT_HEAD

    real = outbox._raw_send
    armed = [False]
    sent: list[bytes] = []

    def hostile(sock: Any, data: Any, flags: int = 0, copy: bool = True) -> Any:
        if armed[0] and type(data) is bytes and data.startswith(MAGIC_FRAME + RESULT_HEAD):
            armed[0] = False
            sent.append(data)
            real(sock, data, flags | zmq.SNDMORE, copy)
            return real(sock, b"a frame no header refers to", flags, True)
        return real(sock, data, flags, copy)

    monkeypatch.setattr(outbox, "_raw_send", hostile)
    sim = mp.Simulator.simple(2)
    try:
        with sim:
            job = mp.function(lambda: mp.device("P0")(lambda: 7)())
            for _ in range(3):  # the program sent, the call site compiled
                assert mp.fetch(job()) == 7
            sim.client.job_timeout = 2.0
            armed[0] = True
            got: Any = mp.fetch(job())
            assert sent, "the broker sent the answer another way: nothing was tested"
            assert got == 7  # the job's own answer, its header checked
            for _ in range(3):  # the stray frame is no later job's answer
                assert mp.fetch(job()) == 7
    finally:
        sim.close()
