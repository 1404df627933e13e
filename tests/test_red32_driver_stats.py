"""Third red team w32, finding R32-4: a broker's answers can pin a gigabyte in a driver.

A job's answer carries each rank's run stats as an opaque blob (``mpl.wire.run_stats``),
not sealed in secure mode: the broker copies the workers' blobs into the ``JobResult``. An
honest broker refuses a blob over ``MAX_STATS_BYTES`` (256 KiB) from a worker; the driver
takes whatever the answer holds, for any ranks, and keeps it with the job's record for
``mp.trace`` (the last 64 jobs of each context). A hostile broker filling each answer's
stats to the 16 MiB header bound so pins about 1 GiB in every context of the driver.

Closed: the driver's receive path (``wire/result_read.py``) refuses an answer with a blob
longer than ``MAX_STATS_BYTES`` (logged as a bad message, as any answer it cannot accept;
since w33 the job it answers fails at once with ``ProtocolError``), and a job's record keeps
the blobs of the job's ranks only (``mpl.driver.context.job_stats``): at most the job's
ranks times the bound.
"""

from __future__ import annotations

import pytest
from test_red32_driver_text import FakeBroker

from mpl.driver.client import Client
from mpl.driver.context import Context
from mpl.driver.job_site import JobSite
from mpl.wire.cluster import ClusterSpec
from mpl.wire.errors import MplError
from mpl.wire.graph import Graph, GraphBuilder
from mpl.wire.jobs import Exec, JobResult
from mpl.wire.record import Record
from mpl.wire.run_stats import MAX_STATS_BYTES
from mpl.wire.session_word import session_id
from mpl.wire.sessions import OpenSession, SessionOpened


def test_a_brokers_stats_past_their_bound_are_refused() -> None:
    blob = b"\x94" + b"x" * (2 << 20)  # 2 MiB a rank, for ranks the job does not have

    def answer(msg: Record) -> list[Record]:
        if not isinstance(msg, Exec):
            return []
        return [JobResult(msg.job, {}, None, False, {r: blob for r in range(7)}, {})]

    broker = FakeBroker(answer)
    client = Client(f"tcp://127.0.0.1:{broker.port}", timeout=10.0)
    try:
        # the answer is dropped as bad (as any the driver cannot read), so the job ends
        # as one with no answer: whichever error says so, nothing of the answer is kept
        with pytest.raises(MplError):
            client.submit("s", Graph(1, (), (), ()), {})
    finally:
        client.close()
        broker.close()


def test_a_jobs_record_keeps_only_its_ranks_stats() -> None:
    """Blobs within the bound, for ranks the job does not have: its record keeps none of
    them (the general path, ctx.run, and the compiled one, JobSite)."""
    blob = b"\x94" + b"x" * (MAX_STATS_BYTES - 1)

    def answer(msg: Record) -> list[Record]:
        if isinstance(msg, OpenSession):
            sid = session_id(msg.name, "driver:d")
            cluster = ClusterSpec.simple(2).to_dict()
            return [SessionOpened(msg.req, sid, "b", cluster, 1.0, False)]
        if isinstance(msg, Exec):
            return [JobResult(msg.job, {}, None, False, {r: blob for r in range(7)}, {})]
        return []

    broker = FakeBroker(answer)
    client = Client(f"tcp://127.0.0.1:{broker.port}", timeout=10.0)
    try:
        ctx = Context(client, session="s")
        builder = GraphBuilder(2)
        builder.op("constant", [], ranks=(1,), value=None)
        graph = builder.build([])
        ctx.run(graph, {})
        JobSite(ctx, graph, ()).run({})
        records = ctx.jobs
    finally:
        client.close()
        broker.close()
    assert [sorted(r.stats) for r in records] == [[1], [1]]
