"""A hostile broker that recorded a sealed ``Exec`` replays it to the worker: refused however
many jobs ran since, in whatever session, and after the worker restarted; honest traffic
(several drivers in one session, several clients of one driver, Execs a little out of order)
runs every job exactly once.

The seals are pure classes: thousands of sealed Execs go straight from a ``DriverSeal`` into
a ``WorkerSeal``, as the broker would hand them on.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import zmq

from mpl.driver.sealing import DriverSeal
from mpl.wire.jobs import Exec, Failed
from mpl.wire.replay import UNKNOWN_STREAM, ReplayGuard, stamp
from mpl.wire.seal import Sealer
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
        """A new worker process for node n0: same keys, nothing remembered."""
        peers = {f"driver:{d}": self.public[d] for d in self.drivers}
        sealer = Sealer(self.keys["node:n0"][1].decode(), "node:n0", peers)
        self.worker = WorkerSeal(sealer, 0)
        return self.worker

    def client(self, driver: str = "a") -> DriverSeal:
        """A new client of ``driver`` (as ``mp.connect`` makes one: its own sealer)."""
        sealer = Sealer(
            self.keys[driver][1].decode(), f"driver:{driver}", {"node:n0": self.public["node:n0"]}
        )
        spec = SimpleNamespace(nodes=[SimpleNamespace(name="n0")])
        seal = DriverSeal(sealer, SimpleNamespace(cluster=spec), trusted=False)  # type: ignore[arg-type]
        seal.bind(SimpleNamespace(nodes=[SimpleNamespace(name="n0", rank=0)]))  # type: ignore[arg-type]
        return seal


_jobs = iter(range(1 << 40))


def sealed(client: DriverSeal, session: str = "s", bindings: Any = None) -> Exec:
    """A new job's Exec for rank 0, sealed by ``client``, as the broker hands it on."""
    plain = {0: bindings} if bindings is not None else {}
    return client.exec(Exec(session, f"job{next(_jobs)}", "digest", (0,), plain, (0,), 5.0))


def runs(worker: WorkerSeal, msg: Exec) -> bool:
    """Whether the worker runs ``msg`` (True) or refuses it as an AuthenticationError."""
    opened, answer = worker.inbound(msg)
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
    several): their jobs interleave and all run; each one's replay is refused later."""
    cluster = Cluster(drivers=("a", "b"))
    clients = [cluster.client("a"), cluster.client("a"), cluster.client("b")]
    first = [sealed(c, "shared") for c in clients]
    msgs = first + [sealed(clients[i % 3], "shared") for i in range(MANY)]
    assert all(runs(cluster.worker, msg) for msg in msgs)
    assert not any(runs(cluster.worker, msg) for msg in first)
    assert all(runs(cluster.worker, sealed(c, "shared")) for c in clients)


def test_a_restarted_worker_refuses_what_was_recorded_past_its_window() -> None:
    """A worker remembers nothing across a restart: what it can still refuse is every Exec
    of a client's stream past its first ``WINDOW`` (a new stream must start at its start)."""
    cluster = Cluster()
    client = cluster.client()
    msgs = [sealed(client) for _ in range(MANY)]
    assert all(runs(cluster.worker, msg) for msg in msgs)
    restarted = cluster.restart()
    assert not any(runs(restarted, msg) for msg in msgs[-100:])
    newcomer = cluster.client()  # a client that connects now runs its jobs
    assert all(runs(restarted, sealed(newcomer)) for _ in range(10))


def test_a_client_whose_stream_a_restarted_worker_forgot_starts_a_new_one() -> None:
    """The client's next job is refused as an unknown stream; the refusal makes it start a
    new stream for that node, and its jobs run again. A forged refusal (the broker's) moves
    it to a new stream no faster than one per window of its jobs."""
    cluster = Cluster()
    client = cluster.client()
    assert all(runs(cluster.worker, sealed(client)) for _ in range(MANY))
    restarted = cluster.restart()
    _, refusal = restarted.inbound(sealed(client))
    assert type(refusal) is Failed and refusal.error.op == UNKNOWN_STREAM
    client.refused(refusal.error)
    assert all(runs(restarted, sealed(client)) for _ in range(10))
    stream = stamp(sealed(client).bindings[0])[0]
    client.refused(refusal.error)  # forged: the stream has numbered too few to be refused
    assert stamp(sealed(client).bindings[0])[0] == stream


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
    that driver's: a forgotten stream's Execs past its first ``window`` stay refused."""
    cluster = Cluster(drivers=("a", "b"))
    worker = cluster.worker
    worker.replays = ReplayGuard(window=64, streams=8)  # the bounds, made small
    other = [sealed(cluster.client("b")) for _ in range(1)]
    kept = cluster.client("b")
    kept_msgs = [sealed(kept) for _ in range(100)]
    gone = cluster.client("a")
    gone_msgs = [sealed(gone) for _ in range(100)]
    assert all(runs(worker, msg) for msg in other + kept_msgs + gone_msgs)
    for _ in range(20):  # driver a's new clients push out a's old stream, never b's
        assert runs(worker, sealed(cluster.client("a")))
    assert worker.replays.streams_of("driver:a") == 8
    assert worker.replays.streams_of("driver:b") == 2
    assert not any(runs(worker, msg) for msg in kept_msgs)
    assert not any(runs(worker, msg) for msg in gone_msgs[64:])
    assert not runs(worker, sealed(gone))  # the forgotten client is refused: it reconnects


def test_the_window_admits_exactly_what_a_set_of_every_number_run_would() -> None:
    """The guard's ring against a model that remembers every number: numbers delivered out
    of order, repeated, and in jumps past the window (its ring wraps round many times)."""
    rng = random.Random(11)
    guard = ReplayGuard(window=16, streams=4)
    box_head = b"mpl-box\x01" + bytes([8]) + b"driver:a" + bytes(range(16))
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
