"""mpl.worker: the ``mpl-worker`` daemon, one per party (rank).

:class:`Worker` (``daemon.py``) is the ZeroMQ shell: a DEALER to the broker, a PULL for
peer data, a result channel. :class:`WorkerState` (``state.py``) makes every decision
without I/O (joining, heartbeats, programs, jobs, aborts, sessions); ``jobs.py`` runs jobs
on a pool of job threads through the graph interpreter (``interpreter.py``, kernels by
opcode), the object store (``store.py``) and the keyed mailbox for peer moves and SPU
messages (``keyed_mailbox.py``). Depends only on ``mpl.wire``; never imports the broker or
the driver.
"""

from mpl.worker.daemon import Worker
from mpl.worker.interpreter import KERNELS, Plan, run_graph
from mpl.worker.jobs import Jobs
from mpl.worker.keyed_mailbox import KeyedMailbox
from mpl.worker.state import WorkerState
from mpl.worker.store import ObjectStore, SymbolDisk

__all__ = [
    "KERNELS",
    "Jobs",
    "KeyedMailbox",
    "ObjectStore",
    "Plan",
    "SymbolDisk",
    "Worker",
    "WorkerState",
    "run_graph",
]
