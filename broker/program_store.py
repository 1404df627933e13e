"""Programs a driver sends before its jobs: checked, then cached per driver identity.

A ``Program`` is cached under (the sender's identity, digest), so one driver's programs are
never run for another. A decoded graph must carry the digest it was sent under; a sealed
one (secure mode) is checked by each recipient once opened. Its size is bounded by
``MAX_PROGRAM_BYTES`` per worker's share, and the cache itself by bytes (``SizedLRU``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpl.broker.actions import Send
from mpl.wire.jobs import Program, program_nbytes
from mpl.wire.limits import MAX_DIGEST_CHARS, MAX_PROGRAM_BYTES

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["ProgramStore"]


class ProgramStore:
    """The program handler of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state

    def on_program(
        self, peer: bytes, msg: Program, now: float, who: str | None = None
    ) -> list[Send]:
        """Cache a driver's program under (its identity, digest), after checking its digest
        and size; a bad one is refused and counted."""
        state = self.state
        identity = state.access.driver(peer, who)
        if identity is None:
            return []
        if len(msg.digest) > MAX_DIGEST_CHARS:  # kept as a key: bounded (wire.limits)
            state.counters["protocol_errors"] += 1
            return [
                state._refuse(
                    peer,
                    "ProtocolError",
                    f"a program's digest has at most {MAX_DIGEST_CHARS} characters, this "
                    f"one {len(msg.digest)}: refused",
                )
            ]
        # Decoded graphs carry the digest of their bytes. A sealed program (secure mode) has
        # no graph in the clear: its recipient checks the digest once it has opened it.
        if msg.graph is not None and msg.graph.digest != msg.digest:
            state.counters["protocol_errors"] += 1
            return [
                state._refuse(
                    peer,
                    "ProtocolError",
                    f"program sent as {msg.digest} has digest {msg.graph.digest}: refused",
                )
            ]
        # what one worker would cache (sealed: each rank's box), and all the broker keeps
        largest = max((program_nbytes(msg, r) for r in msg.sealed), default=0)
        if msg.graph is not None:
            largest = program_nbytes(msg)
        if largest > MAX_PROGRAM_BYTES:
            state.counters["protocol_errors"] += 1
            return [
                state._refuse(
                    peer,
                    "ProtocolError",
                    f"program {msg.digest} of {largest} bytes exceeds MAX_PROGRAM_BYTES "
                    f"({MAX_PROGRAM_BYTES}): refused",
                )
            ]
        state.programs.put((identity, msg.digest), msg, program_nbytes(msg))
        state.program_used[(identity, msg.digest)] = now
        return []
