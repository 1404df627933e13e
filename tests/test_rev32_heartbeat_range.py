"""Review of w32's trust changes: the broker's heartbeat within the range workers take.

A worker takes its broker's heartbeat interval from the Welcome only within
[MIN_HEARTBEAT_S, MAX_HEARTBEAT_S] (red team w32, R32-5), and keeps its own otherwise. An
honest broker started with ``--heartbeat 7200`` was accepted, and every worker then
refused its Welcome's interval (counting a protocol error on every registration), beat
at its own pace, and waited for the broker's beats as if they came at that pace: it took
the broker, beating once in two hours, for lost. The broker now refuses such an interval
at its start, as the workers would.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mpl.broker.cli import main
from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec
from mpl.wire.limits import MAX_HEARTBEAT_S, MIN_HEARTBEAT_S, heartbeat_ok


@pytest.mark.parametrize("heartbeat", [7200.0, MAX_HEARTBEAT_S * 1.5, float("inf")])
def test_a_broker_refuses_a_heartbeat_its_workers_would(heartbeat: float) -> None:
    spec = ClusterSpec.simple(2, enable_spu=False)
    with pytest.raises(ValueError, match="heartbeat"):
        BrokerState(spec, now=0.0, heartbeat_s=heartbeat)
    result = CliRunner().invoke(main, ["--world-size", "2", "--heartbeat", str(heartbeat)])
    assert result.exit_code == 2 and "--heartbeat" in result.output, result.output


def test_a_broker_takes_the_range_its_workers_take() -> None:
    spec = ClusterSpec.simple(2, enable_spu=False)
    for heartbeat in (MIN_HEARTBEAT_S, 1.0, MAX_HEARTBEAT_S):
        assert BrokerState(spec, now=0.0, heartbeat_s=heartbeat).heartbeat_s == heartbeat


@pytest.mark.parametrize("heartbeat", [True, False, float("nan"), "1.0", None])
def test_a_broker_refuses_a_heartbeat_that_is_not_a_number_of_seconds(heartbeat: object) -> None:
    # True compares as 1 and passed the range written out before; the workers' own test
    # (limits.heartbeat_ok) refuses a bool, and the broker now shares that test.
    spec = ClusterSpec.simple(2, enable_spu=False)
    with pytest.raises(ValueError, match="heartbeat"):
        BrokerState(spec, now=0.0, heartbeat_s=heartbeat)  # type: ignore[arg-type]


def test_the_broker_and_its_workers_take_the_same_intervals() -> None:
    # one test decides both sides: what a broker starts with, a worker takes in the Welcome
    spec = ClusterSpec.simple(2, enable_spu=False)
    for heartbeat in (MIN_HEARTBEAT_S / 2, MIN_HEARTBEAT_S, 1, 1.0, MAX_HEARTBEAT_S, True, 0):
        try:
            BrokerState(spec, now=0.0, heartbeat_s=heartbeat)
        except ValueError:
            started = False
        else:
            started = True
        assert started == heartbeat_ok(heartbeat), heartbeat
