"""Review of R33-7/R33-8 (w33-rev-red): the names the receivers now bound are bounded in the
spec too, so a genuine job never has its peer messages refused for a name its spec allowed.

R33-8 refuses a move whose sealer is past MAX_MOVE_NAME_CHARS (256), taking a sealer to be
``driver:`` and 64 characters at most; R33-7 refuses an SPU message whose lane id (the
session id, the device's name, 8 hex digits and a count) is past MAX_SPU_NAME_BYTES. But a
spec's driver and device names had no bound: a driver listed as a 300-character name sealed
jobs whose every move its peers refused as malformed (counted against the honest sender),
and the job waited out its deadline. The spec now refuses such a name, where its operator
sees why.
"""

from __future__ import annotations

import pytest

from mpl.wire.cluster_entries import MAX_SPEC_NAME_CHARS, parse_device, parse_driver
from mpl.wire.data import Move
from mpl.wire.errors import ClusterSpecError
from mpl.wire.identity import driver_identity
from mpl.wire.session_word import session_id
from mpl.worker.peer_intake import MAX_MOVE_NAME_CHARS
from mpl.worker.spu_link import MAX_SPU_NAME_BYTES

KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # any well-formed z85 key


def test_a_spec_driver_name_the_peers_would_refuse_is_refused() -> None:
    name = "d" * (MAX_MOVE_NAME_CHARS + 1 - len(driver_identity("")))
    with pytest.raises(ClusterSpecError, match=r"drivers\[0\]\.name"):
        parse_driver({"name": name, "curve_key": KEY}, 0)


def test_a_spec_device_name_that_makes_a_lane_too_long_is_refused() -> None:
    with pytest.raises(ClusterSpecError, match="devices"):
        parse_device("S" * (MAX_SPU_NAME_BYTES // 2), {"kind": "SPU", "members": ["a", "b"]})


def test_the_longest_names_a_spec_takes_pass_the_receivers() -> None:
    driver = parse_driver({"name": "d" * MAX_SPEC_NAME_CHARS, "curve_key": KEY}, 0)
    device = parse_device("\U0001f600" * MAX_SPEC_NAME_CHARS, {"kind": "SPU", "members": ["a"]})
    sid = session_id("\U0001f600" * 128, driver_identity(driver.name))  # 4-byte chars
    move = Move(sid, "j" * 24, 0, 0, 0, 1, None, driver_identity(driver.name))
    assert max(len(move.session), len(move.job), len(move.sealer)) <= MAX_MOVE_NAME_CHARS
    lane = f"{sid}/{device.name}/{'f' * 8}/{2**63}"  # as SpuKernels names a lane
    assert len(lane.encode()) <= MAX_SPU_NAME_BYTES
