"""Which of its two connections a worker's Done comes back on: counted at the broker.

An inline run's Done goes back on the I/O thread's own dealer, the connection its Exec came
in on (so that one TCP segment carries both the Done and the acknowledgement of the Exec);
a job thread's Done stays on the result channel (only the I/O thread touches its dealer);
and a Done the dealer cannot take (no broker connected to it) goes to the channel, which
queues it. Every Done is told apart at the broker by the peer it came from: the worker's
registered socket (``Registry.by_peer``) or its announced channel (``Registry.channels``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import zmq
from test_worker_calls import (  # noqa: F401  # the fixtures: a Simulator, a secure cluster
    secure,
    sim,
)

import mpl.driver as mp
from mpl.broker.daemon import Broker
from mpl.worker import daemon, result_channel
from mpl.worker.daemon import Worker

_JOBS = 20
_GENEROUS_S = 10.0  # the inline threshold: no run on a busy machine may count as slow


def _done_peers(broker: Broker, run: Any, jobs: int) -> tuple[int, int, int]:
    """Run ``run()`` ``jobs`` times; the Dones the broker read by the hot path from the
    workers' registered sockets, from their result channels, and from neither."""
    registry = broker.state.registry
    peers: list[bytes] = []
    dones = broker.state.dones
    real = dones.read

    def read(peer: bytes, *args: Any) -> Any:
        peers.append(peer)
        return real(peer, *args)

    # the broker's loop takes the handler at the start of a turn of its loop, which may
    # last a while: jobs run until it reads with this one, then the counted ones
    dones.read = read  # type: ignore[method-assign,assignment]
    try:
        deadline = time.monotonic() + 30
        while not peers and time.monotonic() < deadline:
            run()
        assert peers, "the broker's loop never took the counting handler"
        del peers[:]
        for _ in range(jobs):
            run()
        counted = list(peers)
    finally:
        dones.read = real  # type: ignore[method-assign]
    main = sum(peer in registry.by_peer for peer in counted)
    channel = sum(peer in registry.channels for peer in counted)
    peers = counted
    return main, channel, len(peers) - main - channel


def _inline(workers: list[Worker]) -> int:
    return sum(int(w.jobs.stats()["jobs_inline"]) for w in workers)


def test_an_inline_done_comes_back_on_the_connection_its_exec_came_in_on(
    sim: mp.Simulator,  # noqa: F811
) -> None:
    workers = sim.runtime.workers
    for worker in workers:
        worker.jobs.inline_s = _GENEROUS_S
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):  # the first run is on the pool; then it is quick
        assert mp.fetch(job()) == [1, 1]
    inline = _inline(workers)
    main, channel, other = _done_peers(sim.runtime.broker, lambda: mp.fetch(job()), _JOBS)
    assert _inline(workers) - inline >= 2 * _JOBS  # every run inline
    assert (main, channel, other) == (2 * _JOBS, 0, 0)


def test_a_pooled_jobs_done_stays_on_the_result_channel(sim: mp.Simulator) -> None:  # noqa: F811
    workers = sim.runtime.workers
    for worker in workers:
        worker.jobs.inline_s = 0.0  # never inline: every job on a job thread
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):
        assert mp.fetch(job()) == [1, 1]
    inline = _inline(workers)
    main, channel, other = _done_peers(sim.runtime.broker, lambda: mp.fetch(job()), _JOBS)
    assert _inline(workers) == inline
    assert (main, channel, other) == (0, 2 * _JOBS, 0)


def test_a_done_the_dealer_cannot_take_goes_on_the_result_channel(
    sim: mp.Simulator,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dealer with no broker connected queues nothing (IMMEDIATE): its send raises
    ``zmq.Again``, and the Done goes to the result channel, which queues it."""
    workers = sim.runtime.workers
    for worker in workers:
        worker.jobs.inline_s = _GENEROUS_S
    job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
    for _ in range(3):
        assert mp.fetch(job()) == [1, 1]
    dealers = {id(worker.dealer) for worker in workers}
    real_send = result_channel._raw_send
    refused = [0]

    def send(sock: Any, data: Any, flags: int) -> Any:
        if id(sock) in dealers:
            refused[0] += 1
            raise zmq.Again()
        return real_send(sock, data, flags)

    monkeypatch.setattr(result_channel, "_raw_send", send)
    monkeypatch.setattr(daemon, "_raw_send", send)  # the turn's own send (Jobs.run_repeat's)
    inline = _inline(workers)
    main, channel, other = _done_peers(sim.runtime.broker, lambda: mp.fetch(job()), _JOBS)
    assert _inline(workers) - inline >= 2 * _JOBS
    assert refused[0] >= 2 * _JOBS  # every inline Done tried the dealer first
    assert (main, channel, other) == (0, 2 * _JOBS, 0)


def test_a_sealed_inline_done_comes_back_on_the_connection_its_exec_came_in_on(
    secure: tuple[Broker, list[Worker], Any],  # noqa: F811
) -> None:
    broker, workers, ctx = secure
    for worker in workers:
        worker.jobs.inline_s = _GENEROUS_S
    with ctx:
        job = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 1))
        for _ in range(3):
            assert mp.fetch(job()) == [1, 1]
        inline = _inline(workers)
        main, channel, other = _done_peers(broker, lambda: mp.fetch(job()), _JOBS)
    assert _inline(workers) - inline >= 2 * _JOBS
    assert (main, channel, other) == (2 * _JOBS, 0, 0)
