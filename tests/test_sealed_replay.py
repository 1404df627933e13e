"""A hostile broker that recorded a sealed ``Exec`` replays it to the worker: refused however
many jobs ran since, in whatever session, after the worker restarted, and after the worker
forgot its stream; honest traffic (several drivers in one session, several clients of one
driver, Execs a little out of order) runs every job exactly once, and a broker lying about
incarnations or floors causes refusals only.

The seals are pure classes: thousands of sealed Execs go straight from a ``DriverSeal`` into
a ``WorkerSeal``, as the broker would hand them on.
"""

from __future__ import annotations

import random
import secrets
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from mpl.driver.sealing import DriverSeal
from mpl.wire.codec import decode, encode
from mpl.wire.incarnation import public_incarnation
from mpl.wire.jobs import Exec, Failed
from mpl.wire.remote import ErrorInfo
from mpl.wire.replay import (
    STREAMS,
    UNKNOWN_STREAM,
    ReplayGuard,
    epoch_time,
    read_refusal,
    refusal_facts,
    stamp,
)
from mpl.wire.seal import Sealer
from mpl.wire.sealed import BOX_MAGIC, Sealed
from mpl.worker.sealing import WorkerSeal

# more jobs than a worker remembered before sequence numbers (4,096), and more than the
# window of sequence numbers it keeps per stream
MANY = 5000
BIG = b"x" * 40_000  # bindings too large for a compact box: sealed as a Sealed record


class Cluster:
    """Drivers' keys and one node (rank 0) whose worker seal can be restarted."""

    def __init__(self, drivers: tuple[str, ...] = ("a",)) -> None:
        self.keys = {n: zmq.curve_keypair() for n in (*drivers, "node:n0")}
        self.public = {n: k[0].decode() for n, k in self.keys.items()}
        self.drivers = drivers
        self.worker = self.restart()

    def restart(self) -> WorkerSeal:
        """A new worker process for node n0: same keys, nothing remembered, a new
        incarnation (as the daemon draws one per start)."""
        peers = {f"driver:{d}": self.public[d] for d in self.drivers}
        sealer = Sealer(self.keys["node:n0"][1].decode(), "node:n0", peers)
        self.incarnation = public_incarnation(secrets.token_hex(8))
        self.worker = WorkerSeal(sealer, 0, incarnation=self.incarnation)
        return self.worker

    def client(self, driver: str = "a", incarnation: str | None = None) -> DriverSeal:
        """A new client of ``driver`` (as ``mp.connect`` makes one: its own sealer), told
        the worker's incarnation as the broker's ``SessionOpened`` does (``incarnation``:
        another one, a broker's lie)."""
        sealer = Sealer(
            self.keys[driver][1].decode(), f"driver:{driver}", {"node:n0": self.public["node:n0"]}
        )
        spec = SimpleNamespace(nodes=[SimpleNamespace(name="n0")])
        seal = DriverSeal(sealer, SimpleNamespace(cluster=spec), trusted=False)  # type: ignore[arg-type]
        layout = SimpleNamespace(nodes=[SimpleNamespace(name="n0", rank=0)])
        told = self.incarnation if incarnation is None else incarnation
        seal.bind(layout, {0: told})  # type: ignore[arg-type]
        return seal


_jobs = iter(range(1 << 40))


def sealed(client: DriverSeal, session: str = "s", bindings: Any = None) -> Exec:
    """A new job's Exec for rank 0, sealed by ``client``, as the broker hands it on."""
    plain = {0: bindings} if bindings is not None else {}
    return client.exec(Exec(session, f"job{next(_jobs)}", "digest", (0,), plain, (0,), 5.0))


def _wire(msg: Exec) -> Exec:
    """``msg`` as a worker reads it off its socket: a new record each time (the seal opens
    an Exec in place), so a test can hand the same recorded Exec in again, as a broker
    replaying it would."""
    out = decode(encode(msg))
    assert type(out) is Exec
    return out


def runs(worker: WorkerSeal, msg: Exec) -> bool:
    """Whether the worker runs ``msg`` (True) or refuses it as an AuthenticationError."""
    opened, answer = worker.inbound(_wire(msg))
    if opened is not None:
        assert answer is None
        return True
    assert type(answer) is Failed and answer.error.kind == "AuthenticationError", answer
    return False


def test_a_replay_after_thousands_of_other_jobs_is_refused() -> None:
    cluster = Cluster()
    client = cluster.client()
    early = [
        sealed(client),  # a sealed None
        sealed(client, bindings=[1, 2, 3]),  # a compact box
        sealed(client, bindings=[BIG]),  # a Sealed record
    ]
    assert all(runs(cluster.worker, msg) for msg in early)
    assert all(runs(cluster.worker, sealed(client)) for _ in range(MANY))
    refusals = cluster.worker.refusals
    assert [runs(cluster.worker, msg) for msg in early] == [False, False, False]
    assert cluster.worker.refusals == refusals + 3
    assert runs(cluster.worker, sealed(client))  # honest jobs still run


def test_a_replay_into_a_session_closed_and_forgotten_is_refused() -> None:
    """The job ran in a session that has closed since; thousands of jobs ran in others."""
    cluster = Cluster()
    client = cluster.client()
    old = [sealed(client, "closed"), sealed(client, "closed", bindings=[BIG])]
    assert all(runs(cluster.worker, msg) for msg in old)
    for msg in old:
        cluster.worker.forget(msg.session, msg.job)  # as an abort would
    assert all(runs(cluster.worker, sealed(client, f"s{i % 7}")) for i in range(MANY))
    assert [runs(cluster.worker, msg) for msg in old] == [False, False]


def test_execs_a_little_out_of_order_all_run_and_none_twice() -> None:
    """Threads of one client seal and send concurrently: Execs arrive reordered, within the
    worker's window; each runs once, and a replay of any of them is refused later."""
    cluster = Cluster()
    client = cluster.client()
    msgs = [sealed(client, bindings=[i] if i % 3 else None) for i in range(3000)]
    shuffled = []
    rng = random.Random(7)
    for at in range(0, len(msgs), 500):
        block = msgs[at : at + 500]
        rng.shuffle(block)
        shuffled += block
    assert all(runs(cluster.worker, msg) for msg in shuffled)
    assert all(runs(cluster.worker, sealed(client)) for _ in range(MANY))
    assert not any(runs(cluster.worker, msg) for msg in rng.sample(msgs, 50))


def test_drivers_sharing_a_session_and_clients_of_one_driver_never_collide() -> None:
    """Two drivers in one session, and two clients of the same driver (one process may hold
    several): their jobs interleave and all run; each one's replay is refused later. The
    owner's client (the first) opened the session sharing it with b; the others attached
    (mpl.wire.session_word)."""
    cluster = Cluster(drivers=("a", "b"))
    clients = [cluster.client("a"), cluster.client("a"), cluster.client("b")]
    clients[0].speak_for("shared", True, ["b"])
    clients[1].speak_for("shared", False, None)
    clients[2].speak_for("shared", False, None)
    first = [sealed(c, "shared") for c in clients]
    msgs = first + [sealed(clients[i % 3], "shared") for i in range(MANY)]
    assert all(runs(cluster.worker, msg) for msg in msgs)
    assert not any(runs(cluster.worker, msg) for msg in first)
    assert all(runs(cluster.worker, sealed(c, "shared")) for c in clients)


def test_a_restarted_worker_runs_no_recorded_exec_not_even_a_streams_first() -> None:
    """A worker remembers nothing across a restart, but what was sealed for it names the
    process it was sealed for (its incarnation): every recorded Exec is refused, a stream's
    first ones too, and the refusal names the new incarnation."""
    cluster = Cluster()
    client = cluster.client()
    early = [sealed(client), sealed(client, bindings=[1, 2]), sealed(client, bindings=[BIG])]
    msgs = early + [sealed(client) for _ in range(MANY)]
    assert all(runs(cluster.worker, msg) for msg in msgs)
    restarted = cluster.restart()
    refusals = [restarted.inbound(_wire(msg))[1] for msg in early]
    assert not any(runs(restarted, msg) for msg in msgs[-100:])
    for refusal in refusals:
        assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
        assert read_refusal(refusal.error.message) == (cluster.incarnation, -1)
    newcomer = cluster.client()  # a client that connects now runs its jobs
    assert all(runs(restarted, sealed(newcomer)) for _ in range(10))
    assert restarted.replays.streams_of("driver:a") == 1  # no recorded one ever started


def test_a_client_whose_stream_a_restarted_worker_forgot_starts_a_new_one() -> None:
    """The client's next job is refused as an unknown stream; the refusal makes it start a
    new stream for that node, and its jobs run again. A forged refusal (the broker's) moves
    it to a new stream no faster than one per window of its jobs."""
    cluster = Cluster()
    client = cluster.client()
    assert all(runs(cluster.worker, sealed(client)) for _ in range(MANY))
    restarted = cluster.restart()
    _, refusal = restarted.inbound(_wire(sealed(client)))
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    assert read_refusal(refusal.error.message)[0] == cluster.incarnation
    client.refused(refusal.error)  # sealed for the new incarnation, in a new stream
    assert all(runs(restarted, sealed(client)) for _ in range(10))
    stream = stamp(sealed(client).bindings[0])[0]
    client.refused(refusal.error)  # forged: the stream has numbered too few to be refused
    assert stamp(sealed(client).bindings[0])[0] == stream


def test_a_refused_job_is_sent_again_only_when_it_was_sealed_for_no_process() -> None:
    """``refused`` says a job may go once more only when it was sealed for no incarnation
    (the broker named none for its rank: a worker that joined after the session opened),
    under the epoch now in use, for that rank alone, and the refusal names an incarnation:
    that box opens at no worker process, and its new sealing runs once. Another refusal
    kind, a job of two ranks (the other may have run it), one of an older epoch, and a job
    sealed for a known process (a restart: a hostile broker can forge the new process's
    refusal for a job the old one ran) are not sent again; that one's next job runs."""
    cluster = Cluster()
    a, b, c = (cluster.client(incarnation="") for _ in range(3))  # no incarnation known
    job = sealed(a)
    assert not runs(cluster.worker, job)  # sealed for no process: opens nowhere
    _, refusal = cluster.worker.inbound(_wire(job))
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    error = refusal.error
    other = ErrorInfo("AuthenticationError", error.message, rank=0, op="inputs")
    assert a.refused(other, job.bindings) is False  # another kind: nothing learnt
    box = sealed(b).bindings[0]
    assert b.refused(error, {0: box, 1: box}) is False
    older = sealed(c)
    assert c.sealer is not None and c.sealer.renew("node:n0", 0)  # a new epoch from now
    assert c.refused(error, older.bindings) is False

    assert a.refused(error, job.bindings) is True  # sealed for no process
    assert not runs(cluster.worker, job)  # the refused Exec still opens nowhere
    again = a.exec(Exec("s", "again", "digest", (0,), {}, (0,), 5.0))
    assert runs(cluster.worker, again)  # its new sealing runs, once
    assert not runs(cluster.worker, again)
    assert a.refused(error, job.bindings) is False  # names the incarnation known now
    assert a.refused(error, again.bindings) is False

    known = cluster.client()  # told the worker's incarnation
    ran = sealed(known)
    assert runs(cluster.worker, ran)  # the process it was sealed for ran it
    restarted = cluster.restart()
    _, refusal = restarted.inbound(_wire(ran))  # a refusal a broker could forge
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    assert known.refused(refusal.error, ran.bindings) is False  # it ran: not again
    assert not runs(restarted, ran)
    assert runs(restarted, sealed(known))  # the next job is sealed for the new process


def test_an_exec_held_back_past_the_window_is_refused() -> None:
    """The broker holds one Exec back while thousands of its client's later jobs run, then
    delivers it: too old to tell from a replay, so refused (honest reordering stays within
    the window)."""
    cluster = Cluster()
    client = cluster.client()
    held = sealed(client)
    assert all(runs(cluster.worker, sealed(client)) for _ in range(MANY))
    assert not runs(cluster.worker, held)


def test_streams_stay_bounded_per_driver_and_one_drivers_cannot_push_out_anothers() -> None:
    """Each client is a stream; a driver's streams past the bound go, oldest first, and only
    that driver's: a forgotten stream's Execs past its first ``window`` stay refused. (Each
    driver in a session of its own: a session admits its owner alone.)"""
    cluster = Cluster(drivers=("a", "b"))
    worker = cluster.worker
    worker.replays = ReplayGuard(window=64, streams=8)  # the bounds, made small
    other = [sealed(cluster.client("b"), "sb") for _ in range(1)]
    kept = cluster.client("b")
    kept_msgs = [sealed(kept, "sb") for _ in range(100)]
    gone = cluster.client("a")
    gone_msgs = [sealed(gone, "sa") for _ in range(100)]
    assert all(runs(worker, msg) for msg in other + kept_msgs + gone_msgs)
    for _ in range(20):  # driver a's new clients push out a's old stream, never b's
        assert runs(worker, sealed(cluster.client("a"), "sa"))
    assert worker.replays.streams_of("driver:a") == 8
    assert worker.replays.streams_of("driver:b") == 2
    assert not any(runs(worker, msg) for msg in kept_msgs)
    assert not any(runs(worker, msg) for msg in gone_msgs)  # its first ones too: the floor
    _, refusal = worker.inbound(_wire(sealed(gone, "sa")))  # the forgotten client is refused once
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    gone.refused(refusal.error)
    assert runs(worker, sealed(gone, "sa"))  # then it runs again, in a stream above the floor


def test_the_window_admits_exactly_what_a_set_of_every_number_run_would() -> None:
    """The guard's ring against a model that remembers every number: numbers delivered out
    of order, repeated, and in jumps past the window (its ring wraps round many times)."""
    rng = random.Random(11)
    guard = ReplayGuard(window=16, streams=4)
    box_head = BOX_MAGIC + bytes([8]) + b"driver:a" + bytes(range(16))
    ran: set[int] = set()
    for _ in range(20_000):
        top = max(ran, default=-1)
        seq = max(0, top + rng.choice([-20, -15, -3, -1, 0, 1, 1, 1, 2, 5, 17, 40]))
        box = box_head + seq.to_bytes(12, "big") + bytes(16)
        model = seq not in ran and seq > top - 16 and (bool(ran) or seq < 16)
        assert (guard.admit("driver:a", box) == "") is model, (seq, top)
        if model:
            ran.add(seq)
    assert len(ran) > 5000


def test_a_replay_of_a_stream_forgotten_among_many_newer_ones_is_refused() -> None:
    """More than ``STREAMS`` newer clients of one driver (say, short runs over weeks with
    one key) push a client's stream out of the worker's memory. The broker then replays
    that stream's first Execs, as recorded, and with the stream's start rewritten to look
    newer: all refused (the worker keeps the latest start it forgot: a floor; the start is
    authenticated as the rest of the epoch). The forgotten client itself is refused once,
    then runs above the floor."""
    cluster = Cluster()
    first = cluster.client()
    early = [sealed(first), sealed(first, bindings=[1, 2]), sealed(first, bindings=[BIG])]
    assert all(runs(cluster.worker, msg) for msg in early)
    for _ in range(STREAMS + 1):
        assert runs(cluster.worker, sealed(cluster.client()))
    assert cluster.worker.replays.streams_of("driver:a") == STREAMS
    assert not any(runs(cluster.worker, msg) for msg in early)
    for msg in early:  # the stream's start is authenticated: a box, a None, a record
        _, refusal = cluster.worker.inbound(_wire(_restarted_later(msg)))
        assert type(refusal) is Failed and "failed authentication" in refusal.error.message
    _, refusal = cluster.worker.inbound(_wire(sealed(first)))
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    floor = read_refusal(refusal.error.message)[1]
    assert floor == cluster.worker.replays.floor("driver:a") >= epoch_time(stamp_of(early[0]))
    first.refused(refusal.error)
    renewed = sealed(first)
    assert epoch_time(stamp_of(renewed)) > floor
    assert runs(cluster.worker, renewed)
    assert not any(runs(cluster.worker, msg) for msg in early)


def stamp_of(msg: Exec) -> bytes:
    return stamp(msg.bindings[0])[0]


def _restarted_later(msg: Exec) -> Exec:
    """``msg`` with its stream's start (the epoch's first 8 bytes) moved to now: what a
    broker would send to get past a worker's floor."""
    box = msg.bindings[0]
    later = (epoch_time(stamp_of(msg)) + (1 << 40)).to_bytes(8, "big")
    if type(box) is bytes:
        assert box.startswith(BOX_MAGIC)
        at = len(BOX_MAGIC) + 1 + box[len(BOX_MAGIC)]  # the epoch: after magic and sender
        box = box[:at] + later + box[at + 8 :]
    else:
        assert type(box) is Sealed
        box = Sealed(box.sender, later + box.salt[8:], box.sizes, box.parts)
    return Exec(msg.session, msg.job, msg.digest, msg.ranks, {0: box}, msg.inline, msg.timeout_s)


def test_a_client_whose_clock_is_behind_a_workers_floor_runs_after_one_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Streams of one driver are ordered by its clock; a process of that driver whose clock
    is behind the floor (another machine's) is refused once, with the floor, and its next
    stream starts above it."""
    cluster = Cluster()
    worker = cluster.worker
    worker.replays = ReplayGuard(window=64, streams=4)
    for _ in range(6):
        assert runs(worker, sealed(cluster.client()))
    floor = worker.replays.floor("driver:a")
    assert floor > 0
    # another process of the same driver (nothing drawn yet) whose clock says 1970
    monkeypatch.setattr("mpl.wire.replay._drawn", [0])
    monkeypatch.setattr("mpl.wire.replay.time", SimpleNamespace(time_ns=lambda: 10**9))
    behind = cluster.client()
    _, refusal = worker.inbound(_wire(sealed(behind)))
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    assert read_refusal(refusal.error.message) == (cluster.incarnation, floor)
    behind.refused(refusal.error)
    assert all(runs(worker, sealed(behind)) for _ in range(5))


def test_a_broker_lying_about_incarnations_or_floors_causes_refusals_only() -> None:
    """The broker tells a client the wrong incarnation, forges refusals naming another one
    or absurd floors: some jobs are refused, the client finds its way back, and at the end
    not one of the Execs it sealed runs a second time."""
    cluster = Cluster()
    worker = cluster.worker
    every: list[Exec] = []

    def job(client: DriverSeal) -> Exec:
        every.append(sealed(client, bindings=[len(every)] if len(every) % 2 else None))
        return every[-1]

    def forged(client: DriverSeal, incarnation: str, floor: int) -> None:
        message = "job refused: stream: forged" + refusal_facts(incarnation, floor)
        client.refused(ErrorInfo("AuthenticationError", message, rank=0, op=UNKNOWN_STREAM))

    lied_to = cluster.client(incarnation="0123456789abcdef")  # SessionOpened lied
    _, refusal = worker.inbound(_wire(job(lied_to)))
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    lied_to.refused(refusal.error)  # the worker's own word
    assert runs(worker, job(lied_to))

    client = cluster.client()
    assert runs(worker, job(client))
    forged(client, "fedcba9876543210", -1)
    _, refusal = worker.inbound(_wire(job(client)))  # sealed for a process that is not there
    assert type(refusal) is Failed
    client.refused(refusal.error)
    assert runs(worker, job(client))
    stream = stamp_of(every[-1])
    forged(client, cluster.incarnation, epoch_time(stream) - 1)  # below its stream: no news
    assert stamp_of(job(client)) == stream and runs(worker, every[-1])
    forged(client, cluster.incarnation, epoch_time(stream) + (1 << 50))  # far ahead
    assert epoch_time(stamp_of(job(client))) > epoch_time(stream) + (1 << 50)
    assert runs(worker, every[-1])
    forged(client, cluster.incarnation, 1 << 64)  # past any epoch: ignored
    stream = stamp_of(job(client))
    assert runs(worker, every[-1]) and stamp_of(job(client)) == stream
    assert runs(worker, every[-1])

    refusals = worker.refusals
    assert not any(runs(worker, msg) for msg in every)
    assert worker.refusals == refusals + len(every)


def _with_box(msg: Exec, box: bytes, job: str | None = None) -> Exec:
    """``msg`` with rank 0's sealed bindings ``box`` (and job id ``job``): a broker's edit."""
    fields = (msg.session, job or msg.job, msg.digest, msg.ranks, {0: box})
    return Exec(*fields, msg.inline, msg.timeout_s)


def test_a_known_streams_next_none_opens_on_the_short_path_and_nothing_else_does() -> None:
    """``WorkerSeal.open_exec`` accepts a known stream's next sealed None itself (one head
    lookup, its tag, its number as the next); everything else a hostile broker can make of
    those Nones goes down the full path and is refused there, saying why: a replay, a
    flipped tag bit with the next number, a None moved to another job, and a None of a
    stream the guard forgot since its head was learnt. Numbers out of order run on the
    full path, once each."""
    cluster = Cluster()
    worker = cluster.worker
    worker.replays = ReplayGuard(window=64, streams=2)  # a bound, made small
    client = cluster.client()
    full = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_open_exec":
            full[0] += 1

    def taken(msg: Exec) -> tuple[bool, int, str]:
        """(ran, full-path calls, why refused)."""
        full[0] = 0
        sys.setprofile(count)
        try:
            opened, answer = worker.inbound(_wire(msg))
        finally:
            sys.setprofile(None)
        if answer is None:
            return opened is not None, full[0], ""
        assert type(answer) is Failed and answer.error.kind == "AuthenticationError", answer
        return opened is not None, full[0], f"{answer.error.op}: {answer.error.message}"

    assert taken(sealed(client))[:2] == (True, 1)  # the stream's first: the full path
    genuine = sealed(client)
    assert taken(genuine) == (True, 0, "")  # the next one: the short path
    ran, calls, why = taken(genuine)  # replayed
    assert (ran, calls) == (False, 1) and "already ran here" in why
    nxt = sealed(client)
    box = nxt.bindings[0]
    flipped = _with_box(nxt, box[:-1] + bytes([box[-1] ^ 1]))
    ran, calls, why = taken(flipped)
    assert (ran, calls) == (False, 1) and "failed authentication" in why
    moved = _with_box(nxt, box, job="elsewhere")
    assert taken(moved)[:2] == (False, 1)
    assert taken(nxt) == (True, 0, "")  # the genuine one still runs, once
    early, late = sealed(client), sealed(client)
    assert taken(late)[:2] == (True, 1)  # a number skipped: the full path
    assert taken(early)[:2] == (True, 1)  # the skipped one, below the newest
    assert [taken(m)[0] for m in (early, late)] == [False, False]
    assert taken(sealed(client)) == (True, 0, "")  # next again: the short path
    for _ in range(2):  # two newer streams of the same driver push this one out
        assert runs(worker, sealed(cluster.client()))
    assert worker.replays.streams_of("driver:a") == 2
    heads = len(worker._heads)
    ran, calls, why = taken(sealed(client))  # its head still known here, its stream not
    assert (ran, calls) == (False, 1) and why.startswith(f"{UNKNOWN_STREAM}:")
    assert len(worker._heads) == heads - 1  # the head goes, and the window it kept alive
    for _ in range(300):  # the heads kept stay bounded, however many streams ran
        assert runs(worker, sealed(cluster.client()))
    assert 0 < len(worker._heads) <= 256
