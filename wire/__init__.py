"""mpl.wire: the contract every other part leans on.

Dependency direction (checked by ``tests/test_layering.py``)::

    mpl.wire  <-  mpl.broker
              <-  mpl.worker
              <-  mpl.driver     (its local-cluster helpers alone start broker/worker code)

wire imports nothing else of ours; broker and worker never import each other. msgpack and
cloudpickle are imported here and nowhere else.

Modules: ``errors`` (the error tree), ``record`` (tagged dataclasses), ``codec`` (record <->
frames), ``exec_pack`` (the driver's Exec frames from cached parts), ``remote`` (errors
on the wire), one module per message family (``control``,
``sessions``, ``jobs``, ``data``), ``cluster`` (ClusterSpec; its entries read by
``cluster_entries``), ``graph`` (the IR),
``sockets`` (socket options every part applies), ``persist`` (values in files), ``shares``
(SPU shares), ``lru`` (the bounded caches every part keeps), ``kernels`` (named kernels: a
call by name, no code), ``decoder`` (the decoding half of the codec), ``safe_values`` (the
safe value format: what may cross between parties) and ``tables`` (pandas/pyarrow tables as
Arrow IPC). Trust: ``identity`` (who sent a message), ``keys`` (CURVE key files) and
``keytool`` (``mpl-keys``), ``curve`` (CurveZMQ on a socket), ``zap`` (the ZAP handler of a
daemon), ``sealed`` (the record of a payload sealed end to end) and ``seal`` (sealing and
opening it; imported by drivers and workers in secure mode only, never by the broker).
"""

from mpl.wire.cluster import ClusterSpec, Device, Node, RuntimeInfo, SPUConfig
from mpl.wire.codec import MAGIC_FRAME, Pickled, decode, encode
from mpl.wire.errors import (
    AuthenticationError,
    ClusterSpecError,
    DeviceError,
    DeviceInferenceError,
    DeviceNotFoundError,
    GraphError,
    JobAbortedError,
    MessageTooLargeError,
    MplError,
    MplTimeoutError,
    ProtocolError,
    RegistrationError,
    RemoteError,
    RemotePermissionError,
    SessionError,
    UnsafeValueError,
    WorkerLostError,
)
from mpl.wire.graph import OPCODES, Arg, Graph, GraphBuilder, Op, check, fill, format_graph
from mpl.wire.kernels import KernelRef
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo, from_info, to_info

__all__ = [
    "MAGIC_FRAME",
    "OPCODES",
    "Arg",
    "AuthenticationError",
    "ClusterSpec",
    "ClusterSpecError",
    "Device",
    "DeviceError",
    "DeviceInferenceError",
    "DeviceNotFoundError",
    "ErrorInfo",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "JobAbortedError",
    "KernelRef",
    "MessageTooLargeError",
    "MplError",
    "MplTimeoutError",
    "Node",
    "Op",
    "Pickled",
    "ProtocolError",
    "Record",
    "RegistrationError",
    "RemoteError",
    "RemotePermissionError",
    "RuntimeInfo",
    "SPUConfig",
    "SessionError",
    "UnsafeValueError",
    "WorkerLostError",
    "check",
    "decode",
    "encode",
    "fill",
    "format_graph",
    "from_info",
    "to_info",
]
