"""mpl.broker: the ``mpl-broker`` daemon.

One ROUTER socket connects the drivers and the ranked workers of one cluster. The decision
logic is :class:`BrokerState` (``state.py``, no I/O: registry, sessions, calls in flight,
deadlines); :class:`Broker` (``daemon.py``) is the thin ZeroMQ shell that drives it.
Depends only on ``mpl.wire``; never imports the worker or the driver.
"""

from mpl.broker.daemon import Broker
from mpl.broker.query import query_status
from mpl.broker.state import BrokerState, Send

__all__ = ["Broker", "BrokerState", "Send", "query_status"]
