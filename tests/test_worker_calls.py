"""How much Python a worker runs per repeat quick job: counted, not timed.

With many workers on few cores, a fan-out job costs about the sum of every worker's CPU per
job, and most of that is Python run on cold caches: every function call the I/O thread
makes per job counts. These tests count the worker's own calls (``mpl.worker`` and the Done
packing) while it handles one ``Exec`` of a quick job it has run before, so a change that
adds calls to that path shows up here, whatever the machine's speed."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import msgpack
import pytest
import zmq
from helpers import two_rank_keys, wait_until

import mpl.driver as mp
from mpl.broker.daemon import Broker
from mpl.wire import ClusterSpec
from mpl.wire.codec import MAGIC_FRAME
from mpl.wire.curve import Curve
from mpl.wire.done_pack import OneSpanDone
from mpl.wire.hot import read_exec
from mpl.wire.keys import load_keypair
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, is_sealed_exec, split_own
from mpl.worker import daemon
from mpl.worker.daemon import Worker

_JOBS = 40
_GENEROUS_S = 10.0
# 32 calls before the hot path was trimmed (a stop check the state had just made, the
# per-op progress report call, comprehensions and walks over plain outputs, a check of
# refused sessions when there are none, ...), 17 after (with the kernel and the store's
# put counted); then the Done went out before the state's end-of-job bookkeeping (its stop
# check a call of its own, +1) and a run's timing wrapper was folded into the run (-1): 17.
# Then a repeat Exec went straight to its handling (no batch check, no general message
# path: -2, +1 for the Exec's own handler), the job's progress position became an
# attribute (-1), an inline run answered with its Done alone and booked its end and sent it
# without a second call each (-2): 13. Then the job shell read whether an inline job was
# stopped meanwhile by the state's two lookups written out (-1): 12 (11.975 measured: one
# call in 40 jobs falls outside the path). Then a program's inline runs were compiled
# (``inline_run.py``: its run and the run's bookkeeping, no job context, no interpreter,
# no kernel: 4 calls for 5), its Done packed from its fields and sent as frames (no
# record to ``_post``: 2 for 2) and a plaintext repeat handled without ``_on_exec``
# (written out, -1): 10. Then the repeat reader's calls were counted too (+1, the
# comparison), and a plaintext repeat was run by its job id with no record made: 11 (the
# code before counts 13 so). Then a compiled run's one scalar output was stored without
# _store_outputs' call: 10 (209cfaa counts 11). Then the run's stats blob was counted too
# (mpl.wire.run_stats: +1), and a plaintext one-op run's Done, stats and all, was joined
# from a template (done_pack.OneSpanDone.frame for own_done_fields and pack_stats): 10
# (371bb90 counts 11 so). Then counted per turn of the I/O thread that ran a job
# (``Worker._turn`` +1: a repeat is recognised in the turn, in the frame as received,
# ``_on_repeat`` for ``_on_frames``), and a program of one call made that call in the job
# shell (no ``InlineRun.run``, -1): 10 (2357d5f counts 11 so). Then the plaintext repeat's
# common case was fused into one call of the job shell (``Jobs.run_repeat`` for
# ``_on_repeat``, ``run_now`` and ``_run_compiled``), its Done sent by the turn itself (no
# ``_post_done_frame``): 7 (9d6a58f counts 10). Then every inline run went through that
# one call (``run_now`` its wrapper), with the store's ``put_output`` and the state's
# ``end_inline`` written out in it: 5 (ec3def1 counts 7). Half a call of margin, so that a
# stray call does not fail it; the code before does.
_MAX_CALLS_PER_JOB = 5.5
# the wire modules on the worker's side of the path, counted with mpl.worker's
_WIRE_COUNTED = ("/done_pack.py", "/exec_repeat.py", "/run_stats.py")
_BUILT = "records built"  # the key under which _exec_calls counts records made (no __init__)


@pytest.fixture
def sim() -> Iterator[mp.Simulator]:
    ctx = mp.Simulator.simple(2)
    with ctx:
        yield ctx
    ctx.close()


@contextlib.contextmanager
def _exec_calls(
    worker: Worker, forged: list[bytes] | None = None
) -> Iterator[tuple[Counter[str], list[list[bytes]], list[Counter[str]]]]:
    """While inside: the worker-side Python calls (``mpl.worker``, the Done packing, the
    repeat reader and the stats blob, by ``file:function``; and the records built) made in
    the turns of ``worker``'s I/O thread that received a sealed Exec; those Execs as the
    broker sent them (magic, then the rest); and the calls of each such turn that did not
    also run the timers. ``forged``: one-frame messages the I/O thread receives first,
    just before the next sealed Exec, as if the broker had sent them (then emptied).

    The Execs are read at the receive itself (a program's next one is recognised in the
    frame as received: ``Worker._turn``); the worker is kept from resting meanwhile (a
    rest's receive is another, counted by the tests of the rest)."""
    calls: Counter[str] = Counter()
    execs: list[list[bytes]] = []
    quiet: list[Counter[str]] = []
    real_recv: Any = daemon._raw_recv
    real_turn, real_quiet = worker._turn, worker._quiet
    queued: list[Any] = []
    seen = {"exec": False, "more": False, "turns": 0}

    def recv(sock: Any, flags: int, copy: bool) -> Any:
        if sock is not worker.dealer:
            return real_recv(sock, flags, copy)
        frame: Any = queued.pop(0) if queued else real_recv(sock, flags, copy)
        first, seen["more"] = not seen["more"], frame.more
        if first and not frame.more and frame.bytes.startswith(SEALED_EXEC_MAGIC):
            if forged:  # the forgeries first, then this one
                queued.extend([*(zmq.Frame(f) for f in forged), frame])
                forged.clear()
                frame = queued.pop(0)
            seen["exec"] = True
            execs.append([frame.bytes[:4], frame.bytes[4:]])
        return frame

    def turn(next_timers: float) -> float:
        counted: Counter[str] = Counter()
        built = [0]

        def count(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call":
                path = frame.f_code.co_filename.replace("\\", "/")
                if "/mpl/worker/" in path or path.endswith(_WIRE_COUNTED):
                    counted[f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1
            elif event == "c_call" and arg is object.__new__:  # a record built (no __init__)
                built[0] += 1

        seen["exec"] = False
        sys.setprofile(count)
        try:
            return real_turn(next_timers)
        finally:
            sys.setprofile(None)
            seen["turns"] += 1
            if seen["exec"]:
                calls.update(counted)
                calls[_BUILT] += built[0]
                if not counted["jobs.py:report_progress"]:
                    quiet.append(counted)

    worker._quiet = lambda: False  # type: ignore[method-assign]  # awake while counted
    worker._resting = False
    daemon._raw_recv = recv  # type: ignore[assignment]  # the dealer's receives, read
    worker._turn = turn  # type: ignore[method-assign]  # the I/O thread's turns, counted
    try:
        worker._wake()  # out of a rest, if it was in one
        turns = seen["turns"]
        wait_until(lambda: seen["turns"] > turns + 1, what="a turn of the counted loop")
        yield calls, execs, quiet
        # the last job's answer goes out before its turn ends: that turn is counted too
        turns = seen["turns"]
        wait_until(lambda: seen["turns"] > turns, what="the last job's turn to end")
    finally:
        worker._turn = real_turn  # type: ignore[method-assign]  # put back
        daemon._raw_recv = real_recv
        worker._quiet = real_quiet  # type: ignore[method-assign]


def _per_turn(quiet: list[Counter[str]]) -> float:
    """Calls per turn that received a sealed Exec and ran no timers."""
    assert len(quiet) >= _JOBS // 2  # (the timers run every 100 ms at most)
    return sum(sum(n for name, n in t.items() if name != _BUILT) for t in quiet) / len(quiet)


def _worker_calls(sim: mp.Simulator, rank: int, job: Any) -> tuple[float, Counter[str]]:
    """Run ``job`` _JOBS times; the worker-side Python calls per job made while ``rank``'s
    I/O thread took the turns of its loop that ran a job (a plaintext repeat is recognised
    in the frame as received, in the turn itself: ``Worker._turn``), and which functions,
    over the turns that did not also run the timers (every 100 ms at most)."""
    worker: Worker = sim.runtime.workers[rank]
    turns: list[Counter[str]] = []
    real = worker._turn

    def turn(next_timers: float) -> float:
        calls: Counter[str] = Counter()

        def count(frame: FrameType, event: str, arg: Any) -> None:
            path = frame.f_code.co_filename.replace("\\", "/")
            if event == "call" and ("/mpl/worker/" in path or path.endswith(_WIRE_COUNTED)):
                calls[f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1

        sys.setprofile(count)
        try:
            return real(next_timers)
        finally:
            sys.setprofile(None)
            turns.append(calls)

    worker._turn = turn  # type: ignore[method-assign]  # the I/O thread's turns, counted
    try:
        for _ in range(_JOBS):
            assert mp.fetch(job()) == [1, 1]
    finally:
        worker._turn = real  # type: ignore[method-assign]  # put back
    ran = [t for t in turns if t["inline_jobs.py:run_repeat"]]
    # a run per turn (the first job's may fall to the turn that was waiting already, and
    # the last one's may end after its answer came back: neither counted)
    assert _JOBS - 2 <= len(ran) == sum(t["inline_jobs.py:run_repeat"] for t in ran) <= _JOBS
    # the timers did not run, nor had the worker gone to rest (a slow machine's stall)
    quiet = [t for t in ran if not t["jobs.py:report_progress"] and not t["daemon.py:_rest"]]
    assert len(quiet) >= _JOBS // 2
    total = sum(quiet, Counter())
    return sum(total.values()) / len(quiet), total


def test_a_repeat_quick_job_costs_the_worker_few_python_calls(sim: mp.Simulator) -> None:
    # the test counts calls, not time: no run on a busy machine may count as slow
    sim.runtime.workers[1].jobs.inline_s = _GENEROUS_S
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):  # the first run is on the pool, measured; then it is quick
        mp.fetch(job())
    inline_before = int(sim.runtime.workers[1].jobs.stats()["jobs_inline"])
    repeats_before = sim.runtime.workers[1]._execs.repeats
    per_job, calls = _worker_calls(sim, 1, job)
    assert int(sim.runtime.workers[1].jobs.stats()["jobs_inline"]) - inline_before == _JOBS
    # each Exec read by comparison with the one before (mpl.wire.exec_repeat), not in full
    assert sim.runtime.workers[1]._execs.repeats - repeats_before == _JOBS
    assert per_job <= _MAX_CALLS_PER_JOB, (
        f"{per_job:.1f} worker calls per job: {sorted(calls.items())}"
    )
    turns = calls["daemon.py:_turn"]
    # a program's next Exec is recognised first, in the frame as received, and handled at
    # once: not cut in two, checked for a batch, nor taken through the general message path
    assert calls["broker_messages.py:_on_frames"] == calls["broker_messages.py:_read"] == 0
    assert calls["broker_messages.py:_on_broker"] == 0
    assert calls["broker_messages.py:_on_exec"] == 0  # written out for a plaintext repeat
    # said by its job id: no record of it made
    assert calls["exec_repeat.py:repeat_frame"] == turns and calls["exec_repeat.py:record"] == 0
    # run by the job shell's fused repeat, its Done sent by the turn itself on the dealer:
    # none of the calls it stands for (tests/test_fused_repeat.py: the same answers)
    assert calls["inline_jobs.py:run_repeat"] == turns
    assert calls["broker_messages.py:_on_repeat"] == calls["inline_jobs.py:run_now"] == 0
    assert calls["result_channel.py:_post_done_frame"] == 0
    # compiled and answered by frames: no job context, no interpreter, no record to post;
    # a program of one call (this one) is that call, made by the job shell (no run's loop)
    assert calls["inline_jobs.py:_run_compiled"] == 0 and calls["inline_run.py:run"] == 0
    assert calls["interpreter.py:run_graph"] == 0
    assert calls["jobs.py:__init__"] == 0 and calls["daemon.py:_post"] == 0
    # its Done joined from the program's template: no stats blob nor header packed apart
    assert calls["done_pack.py:frame"] == turns and calls["done_pack.py:own_done_fields"] == 0
    # its one value stored as it is (no list of outputs), by the job shell itself
    assert calls["store.py:put_output"] == calls["store.py:put_outputs"] == 0
    # the state's two steps of an inline job: begun by the state, ended by the job shell
    # (WorkerState.end_inline written out: tests/test_fused_repeat.py compares the books)
    assert calls["state.py:begin_inline"] == turns and calls["state.py:end_inline"] == 0
    assert calls["run_stats.py:pack_stats"] == 0
    # the state decided under its lock that the job may run: no second stop check
    assert calls["jobs.py:stopped"] == 0 and calls["state.py:stopped"] == 0


@contextlib.contextmanager
def secure_threads(
    tmp_path: Path, base: ClusterSpec, data_roots: bool = False
) -> Iterator[tuple[Broker, list[Worker], Any]]:
    """A secure cluster of ``base``'s two ranks on threads (CurveZMQ, sealing), its keys
    made in ``tmp_path``, and a driver of it (the analyst's); each worker with a data root
    of its own there if ``data_roots``. The driver closed, then every daemon stopped."""
    spec, secrets = two_rank_keys(tmp_path, base)
    curves = {
        name: Curve(load_keypair(secrets[name]), spec) for name in ("broker", "node0", "node1")
    }
    broker = Broker(spec, "tcp://127.0.0.1:0", curve=curves["broker"]).start()
    workers: list[Worker] = []
    try:
        for rank in range(2):
            root = tmp_path / f"d{rank}" if data_roots else None
            workers.append(
                Worker(broker.address, rank, curve=curves[f"node{rank}"], data_root=root).start()
            )
        for worker in workers:
            assert worker.joined.wait(15), "worker did not join"
        ctx = mp.connect(broker.address, key=secrets["analyst"], cluster=spec, timeout=20)
        with contextlib.closing(ctx), ctx:
            yield broker, workers, ctx
    finally:
        for worker in workers:
            worker.stop()
        for worker in workers:
            worker.join(5)
        broker.stop()
        broker.join(5)


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[Broker, list[Worker], Any]]:
    """A secure cluster of two ranks on threads (CurveZMQ, sealing) and a driver of it."""
    with secure_threads(tmp_path, ClusterSpec.simple(2, enable_spu=False)) as made:
        yield made


# bac702e made 17 calls per sealed repeat here (the repeat's record, then _on_broker, the
# seal's inbound and _on_exec; its Done built as a record, posted, sealed by outbound and
# packed again); read by job id and box and opened without a record, its small results
# sealed in one call and its Done packed from its fields: 13. A program of one call made
# by the job shell (no InlineRun.run): 12 (2357d5f counts 13). Then counted per turn of
# the I/O thread that received a sealed Exec (``Worker._turn`` +1), its repeat recognised
# in the frame as received, header and box in one call (repeat_sealed_frame for
# repeat_sealed and repeat_header, -1): 12 (6010789 counts 13 so). Then run by the job
# shell's one inline run (``Jobs.run_repeat``, for ``run_now`` and ``_run_compiled``; the
# store's ``put_output`` and the state's ``end_inline`` written out): 9 (ec3def1 counts
# 12). Half a call of margin.
_MAX_SEALED_CALLS_PER_JOB = 9.5


def _tampered(frames: list[Any], job: str) -> list[bytes]:
    """The sealed Exec ``frames`` (``mpl.wire.sealed_exec``) for job ``job`` (an id as long
    as its own) with the last byte of its box flipped: what a hostile broker could send as
    a program's next job."""
    header, box, job_id = _box_of(frames)
    assert len(job) == len(job_id)
    header = header.replace(job_id.encode(), job.encode())
    return [SEALED_EXEC_MAGIC, header + msgpack.packb(box[:-1] + bytes([box[-1] ^ 1]))]


def test_a_sealed_repeat_job_is_read_by_comparison_and_still_opened_by_the_seal(
    secure: tuple[Broker, list[Worker], Any],
) -> None:
    """Secure mode: a program's next Exec differs from the last in its job id and its
    sealed box alone; it is read by comparison as in plaintext, and the seal still opens
    (or refuses) every one of them."""
    _, workers, _ = secure
    worker = workers[0]
    worker.jobs.inline_s = _GENEROUS_S
    job = mp.device("P0")(lambda: 1)
    for _ in range(3):
        assert mp.fetch(job()) == 1
    assert worker.seal is not None
    repeats, refused = worker._execs.repeats, worker.seal.refusals
    with _exec_calls(worker) as (calls, execs, quiet):
        for _ in range(_JOBS):
            assert mp.fetch(job()) == 1
    assert worker._execs.repeats - repeats == _JOBS  # none read in full
    assert calls["broker_messages.py:_read"] == calls["broker_messages.py:_on_frames"] == 0
    # its header by its job id, its box where it follows the header, in the frame as
    # received (no record of the Exec, no general message path; bac702e made a record of
    # every one and took it through _on_broker, inbound and _on_exec; 634fe27 compared the
    # box inside bindings; 6010789 cut the frame in two for _on_frames first)
    assert calls["exec_repeat.py:repeat_sealed_frame"] == _JOBS
    assert calls["exec_repeat.py:repeat_sealed"] == calls["exec_repeat.py:repeat_header"] == 0
    assert calls["exec_repeat.py:repeat_box"] == calls["exec_repeat.py:repeat"] == 0
    assert calls["broker_messages.py:_on_broker"] == calls["broker_messages.py:_on_exec"] == 0
    assert calls["broker_messages.py:_on_sealed_repeat"] == _JOBS
    assert calls["sealing.py:open_exec"] == _JOBS  # every one opened by the seal
    # no record built: its Done is packed from its fields (bac702e built the Exec's and the
    # Done's)
    assert calls[_BUILT] == 0
    per_job = _per_turn(quiet)
    assert per_job <= _MAX_SEALED_CALLS_PER_JOB, f"{per_job:.2f} calls: {sorted(calls.items())}"
    # its sealed value is short bytes: its Done joined from the program's template, as in
    # plaintext (2357d5f packed it from its fields: a stats blob and a header packed apart)
    assert calls["done_pack.py:frame"] == _JOBS and calls["done_pack.py:own_done_fields"] == 0
    assert calls["run_stats.py:pack_stats"] == 0 and calls["done_pack.py:_plain"] == 0
    # a next job whose box a hostile broker changed: read by comparison, refused by the seal
    wait_until(lambda: not worker.jobs.state.jobs, what="the last job booked")
    done = int(worker.jobs.stats()["jobs_done"])
    previous = execs[-1]
    forged = _tampered(previous, "f" * len(_box_of(previous)[2]))
    pending = [b"".join(forged)]
    with _exec_calls(worker, pending) as (calls, _, _):
        assert mp.fetch(job()) == 1
    assert not pending and worker.seal is not None and worker.seal.refusals == refused + 1
    assert calls["exec_repeat.py:repeat_sealed_frame"] == 2  # both read in the frame
    assert worker._execs.repeats - repeats == _JOBS + 2  # the forged one, and the next
    # the genuine one alone ran (its end is booked just after its answer went out)
    wait_until(lambda: int(worker.jobs.stats()["jobs_done"]) > done, what="the job booked")
    assert int(worker.jobs.stats()["jobs_done"]) == done + 1


def _box_of(frames: list[Any]) -> tuple[bytes, bytes, str]:
    """A sealed Exec's header, its one box (after the header) and its job id."""
    assert is_sealed_exec(frames) and len(frames) == 2
    header, box = split_own(bytes(memoryview(frames[1])))
    read = read_exec([MAGIC_FRAME, header])
    assert read is not None and read.bindings == {}
    return header, box, read.job


def test_a_hostile_brokers_sealed_exec_forgeries_are_refused_and_run_nothing(
    secure: tuple[Broker, list[Worker], Any],
) -> None:
    """What a hostile broker can do with the sealed Execs it routes, done to rank 0 between
    two genuine jobs: hand it rank 1's Exec, splice rank 1's box (or an earlier job's box)
    into rank 0's header, replay an earlier Exec whole, or drop the box. Every one is
    refused by the seal (counted), none runs, and the genuine next job runs once. The
    forgeries shaped as the program's next Exec are read by comparison, so the lean
    intake (``RepeatExecs.repeat_box`` and ``WorkerSeal.open_exec``, no record) is the one
    refusing them. (bac702e refused them all too, through a record and ``inbound``.)"""
    _, workers, _ = secure
    for worker in workers:
        worker.jobs.inline_s = _GENEROUS_S
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):
        assert mp.fetch(job()) == [1, 1]
    seen: list[list[list[bytes]]] = []
    with (
        _exec_calls(workers[0]) as (_, mine_seen, _),
        _exec_calls(workers[1]) as (_, other_seen, _),
    ):
        for _ in range(2):
            assert mp.fetch(job()) == [1, 1]
        seen = [mine_seen, other_seen]
    mine, other = seen[0][-1], seen[1][-1]
    header, box, job_id = _box_of(mine)
    _, other_box, _ = _box_of(other)
    _, earlier_box, _ = _box_of(seen[0][-2])
    fresh = header.replace(job_id.encode(), ("f" * len(job_id)).encode())
    magic = mine[0]
    # every one shaped as the program's next Exec (its header read by comparison); rank
    # 1's own Exec is rank 1's box under the one header every rank gets
    pack = msgpack.packb
    shaped = {
        "rank 1's box in rank 0's header": [magic, header + pack(other_box)],
        "an earlier job's box under a new job id": [magic, fresh + pack(earlier_box)],
        "a new job id on this job's box": [magic, fresh + pack(box)],
        "an earlier Exec replayed whole": seen[0][-2],
        "this Exec replayed whole": mine,
        "rank 1's own Exec": other,
    }
    forgeries = {
        **shaped,
        "the box dropped": [magic, header],  # no box after the header: refused unopened
    }
    worker = workers[0]
    assert worker.seal is not None
    refused, repeats = worker.seal.refusals, worker._execs.repeats
    errors = worker.protocol_errors
    # the last job's end is booked just after its answer went out: wait for it
    wait_until(lambda: not worker.jobs.state.jobs, what="the last job booked")
    done = int(worker.jobs.stats()["jobs_done"])
    pending = [b"".join(forged) for forged in forgeries.values()]  # each one frame
    with _exec_calls(worker, pending):  # forgeries first
        assert mp.fetch(job()) == [1, 1]
    assert not pending
    assert worker.seal.refusals == refused + len(shaped)  # each one refused by the seal
    assert worker.protocol_errors == errors + len(forgeries)  # and counted, the last unread
    # read by comparison, by job id, as a genuine repeat is (and so is the genuine one)
    assert worker._execs.repeats - repeats == len(shaped) + 1
    wait_until(lambda: int(worker.jobs.stats()["jobs_done"]) > done, what="the job booked")
    assert int(worker.jobs.stats()["jobs_done"]) == done + 1  # the genuine one alone ran


def test_a_sealed_quick_jobs_done_is_joined_from_its_template_as_in_plaintext(
    secure: tuple[Broker, list[Worker], Any],
) -> None:
    """Secure mode: a repeat quick job's small scalar result is sealed for the job's driver
    in one call and its Done joined from the program's template with the box as its value
    and sent as one frame, as in plaintext: no Done record built, posted and sealed on its
    way out, and no stats blob nor header packed apart (2357d5f packed its fields)."""
    _, workers, _ = secure
    worker = workers[0]
    worker.jobs.inline_s = _GENEROUS_S
    job = mp.device("P0")(lambda: 1)
    for _ in range(3):
        assert mp.fetch(job()) == 1
    with _exec_calls(worker) as (calls, _, quiet):
        for _ in range(_JOBS):
            assert mp.fetch(job()) == 1  # opened by the driver: sealed for it
    per_job = _per_turn(quiet)
    assert per_job <= _MAX_SEALED_CALLS_PER_JOB, (
        f"{per_job:.1f} worker calls per sealed job: {sorted(calls.items())}"
    )
    assert calls["sealing.py:sealed_scalars"] == _JOBS
    assert calls["sealing.py:outbound"] == 0 and calls["result_channel.py:_post"] == 0
    assert calls["result_channel.py:_post_done_frame"] == _JOBS
    assert calls["result_channel.py:_post_done_frames"] == 0
    assert calls["done_pack.py:frame"] == _JOBS and calls["run_stats.py:pack_stats"] == 0
    assert calls["inline_jobs.py:_not_stopped"] == 0  # the state's lookups written out


class _NoFrame(OneSpanDone):
    """A program's Done template that joins no frame (as for a job id of 32 bytes or more):
    what a sealed answer meets when its Done does not fit the template."""

    def frame(self, *args: Any) -> bytes | None:
        return None


def test_a_sealed_answer_the_template_does_not_frame_goes_as_a_record_sealed_again(
    secure: tuple[Broker, list[Worker], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Secure mode: a result sealed for the template (``sealed_scalars``) whose Done the
    template does not join is answered by the Done record, sealed by the seal's outbound
    for the driver it answered: every job's value still opens at the driver, none lost."""
    _, workers, _ = secure
    worker = workers[0]
    worker.jobs.inline_s = _GENEROUS_S
    monkeypatch.setattr("mpl.worker.inline_jobs.OneSpanDone", _NoFrame)
    job = mp.device("P0")(lambda: 7)
    for _ in range(3):
        assert mp.fetch(job()) == 7
    with _exec_calls(worker) as (calls, _, _):
        for _ in range(_JOBS):
            assert mp.fetch(job()) == 7
    assert calls["sealing.py:sealed_scalars"] == _JOBS  # sealed for the template first
    assert calls["sealing.py:outbound"] == _JOBS  # the record, sealed again
    assert calls["result_channel.py:_post_done_frame"] == 0
