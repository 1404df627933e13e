"""What secure mode adds per trivial job, counted (never timed): cipher calls and Python calls
in the driver's and the worker's sealing. A job's rank without inputs gets a sealed None
(a tag, no cipher); its one result is the only payload either side runs the cipher on (a
compact box of at most 64 bytes: keyed BLAKE2b, ``mpl.wire.seal_box.box_seal``/``box_open``,
one Python call each; never OpenSSL's AEAD)."""

from __future__ import annotations

import gc
import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
from helpers import sealer_pair

import mpl.driver as mp
from mpl.driver.sealing import DriverSeal
from mpl.wire import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME, encode
from mpl.wire.errors import AuthenticationError
from mpl.wire.exec_pack import exec_frames, exec_parts, pack_bindings
from mpl.wire.jobs import Done, Exec, Failed, JobResult
from mpl.wire.seal import Sealer, done_context, exec_context
from mpl.worker.sealing import WorkerSeal


class _Count:
    """Python calls, calls into the cipher and records built made while it is on."""

    def __init__(self) -> None:
        self.calls = 0
        self.cipher: Counter[str] = Counter()
        self.built = 0  # records made without __init__ (object.__new__)

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            if frame.f_code.co_name in _BOX_CIPHER:  # a small box's
                self.cipher[frame.f_code.co_name] += 1
        elif event == "c_call":
            if arg is object.__new__:
                self.built += 1
            name = getattr(arg, "__qualname__", "")
            if name.startswith(("ChaCha20Poly1305.", "AESGCM.")):  # records', boxes'
                self.cipher[name] += 1

    def __enter__(self) -> _Count:
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


_BOX_CIPHER = ("box_seal", "box_open")


def _jobs(driver: Sealer, n: int, first: int = 0) -> list[tuple[Exec, Done]]:
    """``n`` trivial jobs on rank 0 (no inputs, one inline result) as the worker gets them,
    numbered from ``first``."""
    out = []
    for i in range(first, first + n):
        job = f"j{i}"
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        sealed = driver.seal(None, "node:n0", context, safe=False)
        out.append((Exec("s", job, "d", (0,), {0: sealed}, (0,), 5.0), Done("s", job, 0, {0: 1})))
    return out


def test_a_rank_without_inputs_costs_neither_side_a_cipher_call() -> None:
    driver, node = sealer_pair()
    context = exec_context("s", "j", "d", (0,), (0,), 5.0)
    with _Count() as sealing:
        sealed = driver.seal(None, "node:n0", context, safe=False)
    with _Count() as opening:
        assert node.open(sealed, context, safe=False) == ("driver:a", None)
    with _Count() as again:  # its epoch now known to the node
        node.open(driver.seal(None, "node:n0", context, safe=False), context, safe=False)
    assert sealing.cipher == opening.cipher == again.cipher == Counter()


# main (68feee1) made 19.3 Python calls per job here (the None through the cipher and the
# scalar table, the bindings through a helper, the results through a comprehension); the
# integration branch (b56ed16) 14 (the Exec's and the Done's record.built, two calls each,
# open()'s dispatch to the box, inbound and outbound handing on to _exec and _done, and
# LRU.__setitem__ for the job run); 6.05 before the replay window, whose admission is one
# call per job (mpl.wire.replay), and 5.05 with it once exec_context's and done_context's
# strings were written out in WorkerSeal; 3.05 once a known stream's next sealed None was
# opened and admitted in open_exec itself (634fe27 called Sealer.open_box and
# ReplayGuard.admit for it); 4.05 once the answer's box was sealed by keyed BLAKE2b
# (box_seal, a Python function, where AES-GCM's encrypt was a C call)
_WORKER_CALLS = 4.5


def test_the_workers_sealing_per_trivial_job_one_cipher_call_and_bounded_python_calls() -> None:
    """Opening the job's sealed None and sealing its one result: the result's encryption is
    the only cipher call, and the Python calls stay within their bound."""
    driver, node = sealer_pair()
    worker = WorkerSeal(node, 0)
    warm, jobs = _jobs(driver, 5), _jobs(driver, 20, first=5)  # no replays among them
    for exec_, done in warm:
        worker.inbound(exec_)
        worker.outbound(done)
    sealed: list[Any] = []
    refusals = worker.refusals
    with _Count() as count:  # opened as a repeat read by comparison is (no record of it)
        for exec_, done in jobs:
            opened = worker.open_exec(exec_, exec_.job, exec_.bindings[0])
            sealed.append(worker.outbound(done))
    assert opened is None and worker.refusals == refusals  # (no inputs: they held None)
    for (exec_, _), out in zip(jobs, sealed, strict=True):
        assert type(out) is Done
        context = done_context("s", exec_.job, 0)
        assert driver.open(out.values[0], context, sender="node:n0") == ("node:n0", 1)
    assert count.cipher.keys() <= {"box_seal"}  # main opened every None with a cipher
    assert count.cipher["box_seal"] <= 20
    # no record built: the Exec that opened is the broker's and the Done the job's, each
    # with a field replaced (main, f226f8d, built a new one of each per job)
    assert count.built == 0
    assert all(out is done for (_, done), out in zip(jobs, sealed, strict=True))
    per_job = count.calls / 20
    print(f"{per_job} Python calls per job in the worker's sealing")
    assert per_job <= _WORKER_CALLS


def test_a_known_streams_next_sealed_none_opens_in_one_call_and_one_lookup() -> None:
    """A job without inputs, of a stream whose Nones ran here before, numbered next (most
    jobs): open_exec alone opens it (634fe27 also called Sealer.open_box and
    ReplayGuard.admit: 3 calls), with one dict lookup (its head: the driver, tag key and
    replay window; 634fe27 also looked up the sender's streams, the stream and the exec
    tail), one tag hash and no bytes built but the tag's input and the slices it reads."""
    driver, node = sealer_pair()
    worker = WorkerSeal(node, 0)
    warm, jobs = _jobs(driver, 3), _jobs(driver, 20, first=3)
    for exec_, _ in warm:
        assert worker.open_exec(exec_, exec_.job, exec_.bindings[0]) is None
    last = warm[-1][0]  # a repeat opens as the program's last Exec read in full
    lookups: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            lookups[f"py {frame.f_code.co_name}"] += 1
        elif event == "c_call":
            lookups[getattr(arg, "__qualname__", "")] += 1

    refusals = worker.refusals
    sys.setprofile(count)
    try:
        opened = [worker.open_exec(last, e.job, e.bindings[0]) for e, _ in jobs]
    finally:
        sys.setprofile(None)
    assert opened == [None] * 20 and worker.refusals == refusals
    assert lookups["py open_exec"] == 20 and lookups["py <listcomp>"] == 1
    python_calls = sum(n for name, n in lookups.items() if name.startswith("py "))
    assert python_calls == 20 + 1, sorted(lookups.items())  # (the listcomp: the test's)
    assert lookups["dict.get"] == 20  # the head alone
    assert lookups["blake2b.copy"] == lookups["blake2b.digest"] == 20
    assert worker.recipient("s", jobs[-1][0].job) == "driver:a"  # its results' recipient
    # each ran: a replay of any is refused (by the full path, which says why)
    for exec_, _ in jobs[::7]:
        refused = worker.open_exec(last, exec_.job, exec_.bindings[0])
        assert type(refused) is Failed and "already ran here" in refused.error.message


# f9464a8 made 18 C calls per job here: the same, plus the recipient booked by open_exec
# (len) and read back by sealed_scalars (dict.get), and the answer's context written in
# full for its associated data (str.encode of all of it, then a concatenation); 16 under
# AES-GCM (one encrypt call), 23 with the answer's box sealed by keyed BLAKE2b (in
# box_seal: the pad's and the tag's copy, update and digest, the tag input's join, len);
# 19 with a one-byte box's pad a byte of its nonce's run (box format 5: no pad hashed per
# answer, its run's hash once per 64, outside these 20)
_INLINE_C_CALLS = 19


def test_an_answer_sealed_inline_leaves_no_recipient_booked_and_others_keep_theirs() -> None:
    """A job run inline has its answer sealed (``sealed_scalars``) before the next job is
    opened: its recipient is dropped once used, never booked in the worker's bounded
    memory of jobs (f9464a8 booked every job: a dict entry and its key hashed per job, kept
    until 4096 newer ones pushed it out). A job whose answer goes another way (a pooled
    run's Done record) keeps its recipient past the next job's opening, and one forgotten
    (failed, aborted) before it was booked is booked forgotten."""
    driver, node = sealer_pair()
    worker = WorkerSeal(node, 0)
    jobs = _jobs(driver, 27)
    for exec_, _ in jobs[:3]:  # warm: the stream's head learnt, the epoch for the driver
        assert worker.open_exec(exec_, exec_.job, exec_.bindings[0]) is None
        assert worker.sealed_scalars("s", exec_.job, {0: 1}) is not None
    booked = dict(worker._opened)
    answers, last_read = [], jobs[2][0]  # a repeat opens as the program's last Exec read
    with _Calls() as count:  # as the I/O thread opens a repeat and seals its inline answer
        for exec_, _ in jobs[3:23]:
            worker.open_exec(last_read, exec_.job, exec_.bindings[0])
            answers.append(worker.sealed_scalars("s", exec_.job, {0: 1}))
    for (exec_, _), sealed in zip(jobs[3:23], answers, strict=True):
        assert sealed is not None
        assert driver.open(sealed[0], done_context("s", exec_.job, 0)) == ("node:n0", 1)
    assert worker._opened == booked  # none of the 20 booked
    # open_exec, sealed_scalars, Sealer.seal_scalars (a small int's box_seal written out)
    assert count.python / 20 == 3
    assert "AESGCM.encrypt" not in count.c
    assert count.c.pop("list.append") == 20  # the test's own
    assert sum(count.c.values()) / 20 <= _INLINE_C_CALLS
    # a pooled job's Done (a record, later): its recipient kept past the next opening
    pooled, failed, last = jobs[23], jobs[24], jobs[25]
    for exec_, _ in (pooled, failed):
        assert worker.open_exec(exec_, exec_.job, exec_.bindings[0]) is None
    worker.forget("s", failed[0].job)  # the job opened last fails before the next opens
    assert worker.open_exec(last[0], last[0].job, last[0].bindings[0]) is None
    done = worker.outbound(pooled[1])
    assert type(done) is Done
    assert driver.open(done.values[0], done_context("s", pooled[0].job, 0))[1] == 1
    refused = worker.outbound(failed[1])  # forgotten: no recipient to seal its results for
    assert type(refused) is Failed and "no authenticated driver" in refused.error.message
    assert worker.sealed_scalars("s", failed[0].job, {0: 1}) is None
    assert worker.recipient("s", last[0].job) == "driver:a"
    worker.forget("s", last[0].job)  # the newest, forgotten before it is booked
    assert worker.sealed_scalars("s", last[0].job, {0: 1}) is None
    assert worker.open_exec(jobs[26][0], jobs[26][0].job, jobs[26][0].bindings[0]) is None
    assert worker.recipient("s", last[0].job) == ""  # booked forgotten


def test_a_job_forgotten_on_another_thread_while_it_is_booked_stays_forgotten() -> None:
    """``forget`` (a job thread's Failed, the I/O thread's Abort) may run while the I/O
    thread books the recipient of the job opened last, as the next one opens: whichever
    goes first, the job ends with no recipient. Played here by forgetting it from inside
    the booking's own write, once the driver is written (the other order is forget's
    ordinary case, tested above)."""
    driver, node = sealer_pair()
    worker = WorkerSeal(node, 0)
    jobs = _jobs(driver, 7)
    for exec_, _ in jobs[:2]:  # the stream's head learnt: the next ones take the short path
        assert worker.open_exec(exec_, exec_.job, exec_.bindings[0]) is None

    class Booked(dict[tuple[str, str], str]):
        def __setitem__(self, key: tuple[str, str], driver: str) -> None:
            super().__setitem__(key, driver)
            if driver and key[1] in ("j2", "j3"):  # the other thread, just then
                worker.forget(*key)

    worker._opened = Booked(worker._opened)
    last_read = jobs[1][0]
    for exec_, _ in jobs[2:6]:  # j2 booked as j3 opens (short path), j3 as j4 does (full)
        assert worker.open_exec(last_read, exec_.job, exec_.bindings[0]) is None
        if exec_.job == "j3":
            worker._heads.clear()  # j4 takes the full path (_open_exec: _book_fresh)
    a = "driver:a"
    assert [worker.recipient("s", f"j{i}") for i in range(6)] == [a, a, "", "", a, a]
    worker.forget("s", "j5")  # the newest (short path), forgotten before it is booked
    worker._heads.clear()
    assert worker.open_exec(last_read, "j6", jobs[6][0].bindings[0]) is None  # (full path)
    assert [worker.recipient("s", f"j{i}") for i in range(4, 7)] == [a, "", a]


def _driver_and_nodes() -> tuple[DriverSeal, list[WorkerSeal]]:
    """A driver's seal for a 2-node cluster (spec and layout as plain stand-ins: DriverSeal
    reads only the nodes' names and ranks) and each node's worker seal."""
    names = ("n0", "n1")
    keys = {n: zmq.curve_keypair() for n in ("driver:a", *(f"node:{m}" for m in names))}
    public = {n: k[0].decode() for n, k in keys.items()}
    sealer = Sealer(
        keys["driver:a"][1].decode(), "driver:a", {f"node:{m}": public[f"node:{m}"] for m in names}
    )
    spec = SimpleNamespace(nodes=[SimpleNamespace(name=m) for m in names])
    driver = DriverSeal(sealer, SimpleNamespace(cluster=spec), trusted=False)  # type: ignore[arg-type]
    layout = SimpleNamespace(nodes=[SimpleNamespace(name=m, rank=r) for r, m in enumerate(names)])
    driver.bind(layout)  # type: ignore[arg-type]
    workers = [
        WorkerSeal(
            Sealer(keys[f"node:{m}"][1].decode(), f"node:{m}", {"driver:a": public["driver:a"]}), r
        )
        for r, m in enumerate(names)
    ]
    return driver, workers


# the integration branch (b56ed16) made 20.4 Python calls per 2p job here: the Exec's and the
# JobResult's record.built (two calls each), open()'s dispatch to the box per result, and
# exec_pack's rank check (a helper and its generator) on the sealed bindings; main (e7b802d)
# 10.05, 8.05 once exec_context's and done_context's strings were written out in DriverSeal
# (f226f8d); 7.05 with every rank's sealed None made in one call (Sealer.seal_nones), 6.05
# with every rank's value of an output opened in one call (Sealer.open_all); 5.05 with the
# sealed bindings packed into the call site's header parts as plaintext's are (no Exec
# record to seal in and encode: DriverSeal.sealed and pack_bindings, as JobSite does); 4.05
# with the answer opened by its session's opener (mpl.wire.result_open) in one call; 6.05
# with each rank's box opened by keyed BLAKE2b (box_open, a Python function, where
# AES-GCM's decrypt was a C call); 4.05 with box_open written out in the opener
_DRIVER_CALLS_2P = 4.5


def test_the_drivers_sealing_per_trivial_2p_job_bounded_python_calls() -> None:
    """Sealing a 2p job's bindings (a sealed None per rank), packing its Exec header (as a
    call site does: its parts packed once, the sealed bindings per job) and opening its two
    inline results, counted in the driver."""
    driver, workers = _driver_and_nodes()
    n = 20

    def plain(i: int) -> Exec:  # a new one each time: exec seals the bindings in its place
        return Exec("s", f"j{i}", "d", (0, 1), {}, (0,), 5.0)

    results = []
    for i in range(n + 5):  # each result as the broker hands it on: both ranks' sealed values
        msg = driver.exec(plain(i))
        values: dict[int, Any] = {}
        for rank, worker in enumerate(workers):
            one = Exec("s", msg.job, "d", (0, 1), {rank: msg.bindings[rank]}, (0,), 5.0)
            assert worker.inbound(one)[1] is None
            done = worker.outbound(Done("s", msg.job, rank, {0: rank + 7}))
            assert isinstance(done, Done)
            values[rank] = done.values[0]
        results.append(JobResult(msg.job, {0: values}))
    for i, result in enumerate(results[:5]):  # warm: epochs known
        exec_frames(driver.exec(plain(i)))
        driver.result("s", result)
    fresh = [plain(i) for i in range(5, n + 5)]
    opened = []
    parts = exec_parts("s", "d", (0, 1), (0,), 5.0)
    assert parts is not None
    head, middle, tail = parts
    with _Count() as count:
        for msg, result in zip(fresh, results[5:], strict=True):
            boxes = driver.sealed("s", msg.job, "d", (0, 1), (0,), 5.0, msg.bindings)
            packed = pack_bindings(boxes)
            assert packed is not None
            job = msg.job.encode()  # a fixstr, as JobSite writes the job id
            header = b"".join((head, bytes([0xA0 | len(job)]), job, middle, packed, tail))
            # as a call site opens them: from the JobResult's fields, with its session's
            # opener (DriverSeal.result, for a record, hands its fields to the same one)
            opener = driver.openers.get("s") or driver.opener("s")
            opened.append(opener(result.job, result.values))
    # the sealed Exec packed as the codec packs it
    sealed = Exec("s", msg.job, "d", (0, 1), boxes, (0,), 5.0)
    assert [MAGIC_FRAME, header] == encode(sealed)
    assert all(values == {0: {0: 7, 1: 8}} for values in opened)
    # the results alone run the cipher: in the opener itself (box_open written out there),
    # each rank's tag and pad (BLAKE2b); no AEAD call
    assert count.cipher == {}
    # no record built: the Exec comes back with a field replaced, the JobResult's values
    # are opened from its fields (main f226f8d built a new one of each per job)
    assert count.built == 0
    per_job = count.calls / n
    print(f"{per_job} Python calls per 2p job in the driver's sealing")
    assert per_job <= _DRIVER_CALLS_2P


def _answers(n: int) -> tuple[DriverSeal, list[JobResult]]:
    """A driver's seal and ``n`` answers of trivial 2p jobs (one inline output, 7 on rank 0
    and 8 on rank 1, each sealed by its worker), as the broker hands them on."""
    driver, workers = _driver_and_nodes()
    results = []
    for i in range(n):
        msg = driver.exec(Exec("s", f"j{i}", "d", (0, 1), {}, (0,), 5.0))
        values: dict[int, Any] = {}
        for rank, worker in enumerate(workers):
            one = Exec("s", msg.job, "d", (0, 1), {rank: msg.bindings[rank]}, (0,), 5.0)
            assert worker.inbound(one)[1] is None
            done = worker.outbound(Done("s", msg.job, rank, {0: rank + 7}))
            assert isinstance(done, Done)
            values[rank] = done.values[0]
        results.append(JobResult(msg.job, {0: values}))
    return driver, results


class _Calls:
    """Python calls and C calls (by name) made while it is on."""

    def __init__(self) -> None:
        self.python = 0
        self.c: Counter[str] = Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.python += 1
        elif event == "c_call":
            self.c[getattr(arg, "__qualname__", "")] += 1

    def __enter__(self) -> _Calls:
        # no collection while counting: a finalizer of an earlier test's object (a socket's
        # __del__) run by the collector counted as this code's calls (5 more in one CI run)
        gc.collect()
        self._collecting = gc.isenabled()
        gc.disable()
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        if self._collecting:
            gc.enable()
        self.python -= 1  # this call
        self.c["setprofile"] -= 1  # the call that turned it off


# A 2p job's answer opened as a call site opens it (from the JobResult's fields): 634fe27
# made 2 Python calls (DriverSeal.opened, Sealer.open_all) and 11 C calls (the context
# encoded, 2 dict.items, per rank len, the epoch's dict.get, decrypt, the one-byte value's
# dict.get); now 1 (its session's opener, found by the caller) and 10 (the epoch is known
# per rank by its head: no bytes key hashed, no dict.get); then 3 and 26 with each rank's
# box opened by keyed BLAKE2b (box_open per rank, a Python function, where AES-GCM's
# decrypt was one C call: in it len, the tag's copy, join, update, digest and
# compare_digest, the pad's copy, update and digest); now 1 and 24 with box_open written
# out in the opener (no len of the box in it, a one-byte value read from a table by its
# byte: no dict.get); now 1 and 22 with the box's size read once per rank (one len, not
# two) and a one-byte box's tag input joined from its nonce and a table's length and
# ciphertext (no slice of the ciphertext); now 1 and 18 with each one-byte box's pad a
# byte of its nonce's run (box format 5: the pad's copy, update and digest per rank become
# one int.from_bytes; the run's hash, once per 64 boxes, falls outside these)
_OPEN_PYTHON_CALLS = 1
_OPEN_C_CALLS = 18


def test_a_2p_answer_is_opened_in_one_python_call_finding_each_ranks_epoch_by_its_head() -> None:
    n = 20
    driver, results = _answers(2 * n + 5)
    for result in results[:5]:  # warm: epochs known, the session's opener made
        driver.result("s", result)
    opened = []
    with _Calls() as count:
        for result in results[5 : n + 5]:
            opener = driver.openers.get("s") or driver.opener("s")  # JobSite.run's
            opened.append(opener(result.job, result.values))
    assert opened == [{0: {0: 7, 1: 8}}] * n
    assert "AESGCM.decrypt" not in count.c
    assert count.c["dict.get"] == n  # the opener's (a one-byte value is read from a table)
    # each rank's tag (format 4 also hashed each rank's pad: format 5 takes it from the
    # run kept, every number here in run 0, hashed while warming)
    assert count.c["blake2b.digest"] == 2 * n
    assert count.python / n == _OPEN_PYTHON_CALLS
    assert count.c.pop("list.append") == n  # the test's own
    assert sum(count.c.values()) / n == _OPEN_C_CALLS
    with _Calls() as general:  # a record's (Client.submit's, the pump's): one call more
        for result in results[n + 5 :]:
            driver.result("s", result)
    assert general.python / n == _OPEN_PYTHON_CALLS + 1  # 3 at 634fe27


def test_an_answer_is_opened_in_the_dicts_it_was_decoded_into() -> None:
    """The opener builds no dict per answer: each sealed value is replaced by its value in
    the answer's own dicts (decoded for this call: nobody else holds them), which come back
    (main at f9464a8 built a new dict per answer and per output)."""
    driver, results = _answers(6)
    for result in results[:5]:  # warm: epochs known, the session's opener made
        driver.result("s", result)
    opener = driver.openers["s"]
    sealed = results[5].values
    per_rank = sealed[0]
    opened = opener(results[5].job, sealed)
    assert opened is sealed and opened[0] is per_rank
    assert opened == {0: {0: 7, 1: 8}}


def test_the_workers_memory_of_run_jobs_stays_bounded_oldest_out_first() -> None:
    """The jobs a worker remembers (for refusing replays and sealing results) are keyed by
    network input: past the bound the oldest goes, whatever the fast path that adds them."""
    driver, node = sealer_pair()
    worker = WorkerSeal(node, 0)
    worker._opened_limit = 3  # the bound, made small (it is _MEMORY)
    jobs = _jobs(driver, 6)
    for exec_, done in jobs[:5]:
        assert worker.inbound(exec_)[1] is None
        worker.outbound(done)  # a Done record (not sealed inline): its recipient kept
    # the newest (j4) is kept apart until the next job is opened, the others booked
    assert list(worker._opened) == [("s", "j1"), ("s", "j2"), ("s", "j3")]
    a = "driver:a"
    assert [worker.recipient("s", f"j{i}") for i in range(6)] == ["", a, a, a, a, ""]
    worker.forget("s", "j3")  # a failed job's recipient forgotten, in its place
    worker.forget("s", "j4")  # and the newest's, not booked yet
    worker.forget("s", "j9")  # (one never opened here is not remembered)
    assert [worker.recipient("s", f"j{i}") for i in range(6)] == ["", a, a, "", "", ""]
    assert worker.inbound(jobs[5][0])[1] is None  # the next: j4 booked, still forgotten
    assert list(worker._opened) == [("s", "j2"), ("s", "j3"), ("s", "j4")]
    assert [worker.recipient("s", f"j{i}") for i in range(6)] == ["", "", a, "", "", a]


def test_a_rank_with_no_node_in_the_drivers_spec_is_refused_with_or_without_inputs() -> None:
    """The driver seals nothing for a rank its spec names no node for, whether the job's
    Nones are sealed in one call (no inputs) or rank by rank, and opens no result from it:
    it says which rank."""
    driver, _ = _driver_and_nodes()
    for bindings in ({}, {0: [1]}):
        msg = Exec("s", "j", "d", (0, 2), dict(bindings), (0,), 5.0)
        with pytest.raises(AuthenticationError, match="rank 2 is not a node"):
            driver.exec(msg)
    with pytest.raises(AuthenticationError, match="rank 2 is not a node"):  # nor opens from it
        driver.result("s", JobResult("j", {0: {2: b"mpl-box"}}))


def test_a_call_sites_sealed_result_is_opened_from_its_fields_with_no_record_built() -> None:
    """A compiled call site's secure job (real daemons): its answer is read as fields, and
    its sealed values opened from them, with no JobResult built to hand to the seal, and
    its sealed bindings packed into the header with no Exec record: the output's Value is
    the one object built without __init__ per job (bac702e built the Exec and a JobResult
    too: 3 per job)."""
    n, count = 20, _Count()
    _call_site_jobs_counted(n, count)
    # both ranks' results opened in the session's opener itself (box_open written out
    # there: each tag and pad a BLAKE2b, counted below), no AEAD call
    assert count.cipher == {}
    assert count.built == n  # the output's Value: no Exec record, no JobResult


def _call_site_jobs_counted(n: int, counter: _Count | _Calls) -> None:
    """``n`` secure trivial 2p jobs of one warm call site on real daemons, sent under
    ``counter`` (their results fetched after)."""
    spec = ClusterSpec.simple(2, enable_spu=False)
    with mp.local_cluster(spec, secure=True, timeout=20) as ctx:
        job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
        for _ in range(3):
            assert mp.fetch(job()) == [1, 1]
        results = []
        with counter:
            for _ in range(n):
                results.append(job())
        assert [mp.fetch(r) for r in results] == [[1, 1]] * n
        ctx.close()


# A call site's secure trivial 2p job (job() alone) at 0d604cf made 51 C calls in the driver:
# 5 str.encode (the job id, the Exec context, each rank's incarnation suffix, the answer's
# associated data) and 4 dict.values (one to check that every box is compact); now 48: the
# suffixes are kept encoded per worker, a sealed None is known compact, and the Exec
# context around the job id is written once per call site (no ExecTails lookup per job).
# Only those calls are pinned: a finaliser the collector runs meanwhile adds calls of its own


def test_a_call_sites_sealed_nones_encode_no_suffix_and_check_no_box_type() -> None:
    n, count = 20, _Calls()
    _call_site_jobs_counted(n, count)
    # a sealed None per rank, and each rank's answer's tag (format 4 also hashed each
    # answer's pad: format 5 takes it from its run of 64, hashed at most once per rank
    # among these n)
    assert 4 * n <= count.c["blake2b.digest"] <= 4 * n + 2
    assert count.c["str.encode"] == 3 * n  # the job id, its Exec context, the answer's
    assert count.c["dict.values"] <= 3 * n  # none to check the boxes are compact
