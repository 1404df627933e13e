"""A secure ``Exec`` on the wire: one common header, then each rank's sealed box in a frame
of its own, so the broker forwards it without cutting a header per rank.

From the driver to the broker::

    frame 0       SEALED_EXEC_MAGIC   b"MPS" + the codec's version byte
    frame 1       the Exec's header, packed as ``encode`` packs it, its bindings empty
    frame 2..n+1  the sealed box (``bytes``) of ``ranks[0]``, ..., ``ranks[n-1]``

From the broker to each rank ``ranks[i]``: frames 0 and 1 as they came, then frame
``2 + i`` alone. The broker reads the header on the plaintext lean path
(:func:`read_sealed_exec`: exactly what ``decode`` accepts, bindings empty) and checks that
there is one box frame per rank, each of 1 to :data:`MAX_BOX_BYTES` bytes; it never reads a
box. A worker reads the header as it reads a plaintext Exec (``mpl.wire.exec_repeat``) and
opens its box, which is bound to its sender, its recipient worker process, the session,
the job, its number and every other field of the header (``mpl.wire.seal_contexts``): a
box moved to another rank, job or header does not open there.

Only compact boxes travel so (every job without large inputs); an Exec with a ``Sealed``
record among its bindings keeps the codec's shape (the boxes in the header's bindings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zmq import Frame as _Frame

from mpl.wire.codec import MAGIC_FRAME, VERSION, ZERO_COPY_BYTES, decode
from mpl.wire.errors import ProtocolError
from mpl.wire.hot import read_hot_header
from mpl.wire.jobs import Exec

__all__ = ["MAX_BOX_BYTES", "SEALED_EXEC_MAGIC", "is_sealed_exec", "read_sealed_exec"]

SEALED_EXEC_MAGIC = b"MPS" + bytes([VERSION])
# A compact box holds less than COMPACT_MAX (half of this) of ciphertext plus its head: a
# box frame over this is no box (nor is an empty one)
MAX_BOX_BYTES = ZERO_COPY_BYTES
_MAGIC_LEN = len(SEALED_EXEC_MAGIC)


def is_sealed_exec(frames: Sequence[Any]) -> bool:
    """Whether ``frames`` (one message, no routing envelope) begins with the sealed Exec's
    magic (len() of a received ``zmq.Frame`` is its size: only a 4-byte frame is read)."""
    if not frames:
        return False
    first = frames[0]
    return len(first) == _MAGIC_LEN and bytes(first) == SEALED_EXEC_MAGIC


def read_sealed_exec(frames: Sequence[Any]) -> Exec:
    """The ``Exec`` of a sealed Exec's frames (its header read as a plaintext Exec's, its
    bindings empty), once every check passes: one box frame per rank of its ``ranks``,
    each 1 to ``MAX_BOX_BYTES`` bytes. Raises ``ProtocolError`` saying what is wrong."""
    if not is_sealed_exec(frames):
        raise ProtocolError("not a sealed Exec")
    if len(frames) < 3:
        raise ProtocolError("a sealed Exec without boxes")
    raw = frames[1]
    header = raw.bytes if hasattr(raw, "bytes") else bytes(raw)
    read = read_hot_header(MAGIC_FRAME, header)
    if type(read) is not Exec:  # the lean reader left it: decode accepts it or says why not
        msg = decode([MAGIC_FRAME, header], unpickle=False)
        if type(msg) is not Exec:
            raise ProtocolError(f"a sealed Exec's header holds a {msg.TAG!r} record")
        read = msg
    if read.bindings:
        raise ProtocolError("a sealed Exec's header carries bindings (its boxes are frames)")
    boxes = len(frames) - 2
    if boxes != len(read.ranks):
        raise ProtocolError(
            f"a sealed Exec of {len(read.ranks)} ranks carries {boxes} box frames (one per rank)"
        )
    for box in frames[2:]:  # a plain loop: no Python call per rank
        if type(box) is not _Frame and type(box) is not bytes:
            raise ProtocolError(f"a sealed Exec's box frame is a {type(box).__name__}")
        size = len(box)  # a received frame's size, or the bytes' length
        if not 0 < size <= MAX_BOX_BYTES:
            raise ProtocolError(f"a sealed Exec's box frame of {size} bytes (1 to {MAX_BOX_BYTES})")
    return read
