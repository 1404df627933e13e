"""``mp.local_cluster(heartbeat_s=...)`` sets the driver's interval too, not only the daemons'.

The driver declares its broker silent after a few of its own intervals without a word; when
the daemons beat slower than the driver expected (``heartbeat_s=10`` for a 32-worker cluster
on a busy machine), the driver gave up on a healthy broker after about 3 s.
"""

from __future__ import annotations

import pytest
from helpers import one

import mpl.driver as mp

pytestmark = pytest.mark.daemons


def test_the_driver_beats_at_the_clusters_interval() -> None:
    with mp.local_cluster(1, heartbeat_s=2.5) as ctx:
        assert ctx.processes.heartbeat_s == 2.5
        assert ctx.client.heartbeat_s == 2.5
        assert mp.fetch(mp.device("P0")(one)()) == 1
