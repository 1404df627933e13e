"""Second red team w31, finding B5 (open, strict xfail): every listed driver reads every
other driver's persisted names, with each one's parties, device and description.

A secure broker shows another driver's sessions only as a count, and its status page shows
no persisted names; but ``mp.symbols()`` (a ``ListRequest`` of ``symbols``) and a driver's
``status`` (``persisted_symbols``) list the whole table of persisted names (``broker/
listing.py`` ``Listing.persisted``, ``broker/status_view.py``): any listed driver, one that
shares no session with the owner too, learns what the others persisted, where, and its
``float64[3]``-style description. The values stay sealed; their names (``payroll_cuts``)
and shapes do not.

The fix is not local: the broker keeps no owner per persisted name. It knows the driver of
the job whose Done reported a save (the Exec's authenticated sender), so it could keep
that owner per entry and list a name only to it; names a worker's hello lists after a
broker restart would need their owners from the worker, which writes each file's owner
(``worker/symbol_owner.py``) and could report it, or be listed to no one.
"""

from __future__ import annotations

import pytest

from mpl.broker.state import BrokerState
from mpl.wire.cluster import ClusterSpec
from mpl.wire.sessions import ListRequest, Reply, SymbolInfo


@pytest.mark.xfail(strict=True, reason="B5: persisted names are listed to every driver")
def test_a_driver_does_not_list_another_drivers_persisted_names() -> None:
    state = BrokerState(ClusterSpec.simple(2, enable_spu=False), now=0.0, secure=True)
    # what a Done of alice's job reports saving (the broker records it as below)
    info = SymbolInfo("payroll_cuts", "P0", (0,), True, {"desc": "float64[3]"})
    state.persisted.saved(info, (0,))
    out = state.handle(b"bob", ListRequest(1, "symbols", ""), 0.0, who="driver:bob")
    assert len(out) == 1 and isinstance(out[0].msg, Reply)
    listed = [row["name"] for row in out[0].msg.value["persisted"]]
    assert "payroll_cuts" not in listed, "bob lists alice's persisted name"
