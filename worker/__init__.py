"""mpl.worker: the ``mpl-worker`` daemon, one per party (rank).

:class:`Worker` (``daemon.py``) is the ZeroMQ shell: a DEALER to the broker, a PULL for
peer data, a result channel. :class:`WorkerCore` (``core.py``) decides joining, heartbeats
and reconnects without I/O; ``jobs.py`` runs jobs on per-session threads through the graph
interpreter (``interpreter.py``, kernels by opcode), the object store (``store.py``) and
the keyed mailbox for peer moves and SPU messages (``keyed_mailbox.py``). Depends only on
``mpl.wire``; never imports the broker or the driver.
"""

from mpl.worker.core import WorkerCore
from mpl.worker.daemon import Worker
from mpl.worker.interpreter import KERNELS, Plan, run_graph
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import KeyedMailbox
from mpl.worker.store import ObjectStore, SymbolDisk

__all__ = [
    "KERNELS",
    "Jobs",
    "KeyedMailbox",
    "ObjectStore",
    "Plan",
    "SymbolDisk",
    "Worker",
    "WorkerCore",
    "run_graph",
]
