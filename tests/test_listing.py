"""Listing and admin (issue 11, part 3): what a driver may see of sessions, names and
programs, closing a session by name, and the same rules on the status page."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from typing import Any

import numpy as np
import pytest
from helpers import wait_until

import mpl.driver as mp
from mpl.broker.listing import size_of
from mpl.driver.launcher import daemon_command
from mpl.wire.errors import SessionAccessError, SessionError


def test_sizes_come_from_array_descriptions() -> None:
    assert size_of("float64[3, 2]") == 48
    assert size_of("bool[4]") == 4
    assert size_of("int32[]") == 4
    assert size_of("DataFrame") is None


@pytest.mark.daemons
def test_listing_shows_what_was_made_and_closing_by_name_frees_it(make_cluster: Any) -> None:
    cluster = make_cluster("tcp")
    url = cluster.address
    work = mp.connect(url, driver="alice", session="work")
    again = mp.connect(url, driver="alice")
    bob = mp.connect(url, driver="bob", session="bobs")
    eve = mp.connect(url, driver="eve")
    try:
        with work:
            v = mp.device("P0")(lambda: np.arange(3.0))()
            mp.save(v, "x", persist=False)
            mp.save(mp.device("P1")(lambda: np.ones(2))(), "kept", persist=True)

            @mp.function
            def twice(a: Any) -> Any:
                return mp.device("P0")(lambda t: t * 2)(a)

            mp.fetch(twice(v))

        mine = mp.sessions(work)
        rows = {r["name"]: r for r in mine["sessions"]}
        # `again` opened an anonymous session of alice's: its driver named it (s + 16 hex)
        assert set(rows) == {"work", again.session.split("~")[0]}
        assert rows["work"]["mine"] and rows["work"]["symbols"] == 1
        assert rows["work"]["owner"] == "driver:alice" and mine["others"] == 2
        seen_by_bob = mp.sessions(bob)
        assert [r["name"] for r in seen_by_bob["sessions"]] == ["bobs"]
        assert seen_by_bob["others"] == 3  # alice's two and eve's, counted only

        names = mp.symbols(work)
        assert [
            (r["name"], r["parties"], r["meta"], r["size_bytes"]) for r in names["session"]
        ] == [("x", [0], "float64[3]", 24)]
        assert [(r["name"], r["rank"], r["device"]) for r in names["persisted"]] == [
            ("kept", 1, "P1")
        ]
        assert mp.symbols(bob)["session"] == []
        with pytest.raises(SessionAccessError):
            mp.connect(url, driver="eve", session="work")
        with pytest.raises(SessionAccessError, match="only its owner may"):
            mp.close_session("work", eve)

        programs = mp.programs(work)
        assert any(p["name"].endswith("twice") and p["ranks"] == [0] for p in programs)
        assert all(p["digest"] for p in programs) and mp.programs(bob) == []
        assert all(p["idle_s"] is not None and 0 <= p["idle_s"] < 60 for p in programs)

        def objects() -> int:  # values the workers hold, from their heartbeats
            return sum(r.get("objects", 0) for r in again.status()["ranks"])

        held = wait_until(lambda: objects() >= 3 and objects(), what="heartbeats")
        mp.close_session("work", again)  # another connection of the same owner
        with pytest.raises(SessionError), work:
            mp.device("P0")(lambda: 1)()
        wait_until(lambda: objects() < held, what="the closed session's values to be freed")
        assert "work" not in [r["name"] for r in mp.sessions(again)["sessions"]]
        with pytest.raises(SessionError, match="no open session named 'work'"):
            mp.close_session("work", again)
    finally:
        for ctx in (work, again, bob, eve):
            ctx.close()

    out = subprocess.run(
        [*daemon_command("mpl-broker"), "status", url, "--symbols"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "kept" in out and "P1" in out and "float64[2]" in out
    out = subprocess.run(
        [*daemon_command("mpl-broker"), "status", url, "--sessions", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert json.loads(out)["sessions"] == []  # every context above is closed


@pytest.mark.daemons
def test_a_secure_brokers_status_page_shows_sessions_only_as_counts(make_cluster: Any) -> None:
    cluster = make_cluster("tcp", secure=True, broker_args=("--metrics-port", "0"))
    client = cluster.client(curve=cluster.impl.curve)
    client.open_session("payroll-2026")
    base = cluster.impl.metrics_url("broker")
    with urllib.request.urlopen(base + "/status.json", timeout=10) as reply:
        status = json.loads(reply.read())["status"]
    assert status["sessions"] == [] and status["other_sessions"] == 1
    with urllib.request.urlopen(base + "/", timeout=10) as reply:
        page = reply.read().decode()
    assert "payroll-2026" not in page and "1 session(s) of drivers, not shown" in page
