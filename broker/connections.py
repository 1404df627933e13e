"""The broker's watch on its TCP connections: a closed one ends its peer at once.

A socket monitor reports closed TCP connections; a message's source fd (on every part)
maps them back to a peer, so a killed worker is noticed in milliseconds rather than after 3
missed heartbeats. The kernel reuses fds, so the monitor's queued events are read before a
new peer's fd is mapped: a closed connection's DISCONNECTED never ends the peer that took
its fd.

A mixin of :class:`mpl.broker.daemon.Broker`, as :class:`mpl.broker.outbox.Outbox` is: the
methods here read the same socket and state. None runs per message of a peer already mapped
(the loop looks at :attr:`ConnectionWatch._peer_fd` itself); the timers drain the monitor.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from mpl.broker.actions import Send
from mpl.broker.state import BrokerState
from mpl.wire.record import Record
from mpl.wire.sockets import drain

__all__ = ["ConnectionWatch"]


class ConnectionWatch:
    """Closed TCP connections to peers (a mixin: :class:`mpl.broker.daemon.Broker` sets up
    the router and state, then calls :meth:`_watch_connections`)."""

    router: zmq.Socket[Any]
    state: BrokerState
    # the monitor of the router's TCP connections (None on inproc: no fds to watch)
    monitor: zmq.Socket[Any] | None
    _fd_peer: dict[int, bytes]  # a connection's fd -> the peer whose messages came on it
    _peer_fd: dict[bytes, int]  # and back

    def _perform(self, actions: list[Send], logged: bool = False) -> None:
        raise NotImplementedError  # (Outbox's)

    def _contain(self, peer: bytes | None, msg: Record | None, exc: Exception) -> None:
        raise NotImplementedError  # (the Broker's)

    def _watch_connections(self, address: str) -> None:
        """Start watching the router bound to ``address`` (TCP only)."""
        self._fd_peer, self._peer_fd = {}, {}
        self.monitor = None
        if address.startswith("tcp://"):
            self.monitor = self.router.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
            )

    def _unwatch(self) -> None:
        """Stop the monitor (the router closes after it)."""
        if self.monitor is not None:
            self.router.disable_monitor()
            self.monitor.close(linger=0)

    def _map_peer(self, peer: bytes, part: Any) -> None:
        """Note the connection of ``peer``'s message (``part``: one of its received frames)
        if it is not mapped yet."""
        if self.monitor is None or peer in self._peer_fd:
            return
        fd = part.get(zmq.SRCFD)  # every part carries it
        if fd >= 0:
            # A connection that closed may have left this fd to this one, and its
            # DISCONNECTED (queued before this peer's first message could arrive) must
            # end that peer, not this one: read the monitor's events first.
            try:
                self._drain_monitor()
            except Exception as exc:
                self._contain(None, None, exc)
            self._fd_peer[fd] = peer
            self._peer_fd[peer] = fd

    def _drain_monitor(self) -> None:
        """Read the monitor's events: an accepted connection's fd forgets its last peer, a
        closed one ends the peer mapped to it."""
        assert self.monitor is not None
        for frames in drain(self.monitor, look_first=True):  # most often empty
            # libzmq's monitor event: [uint16 event, uint32 value (the fd)], then the endpoint
            head = frames[0].bytes
            if len(head) < 6:
                continue
            event, fd = int.from_bytes(head[:2], "little"), int.from_bytes(head[2:6], "little")
            if event == zmq.EVENT_ACCEPTED:
                stale = self._fd_peer.pop(fd, None)  # fds are reused
                if stale is not None:
                    self._peer_fd.pop(stale, None)
            elif event == zmq.EVENT_DISCONNECTED:
                peer = self._fd_peer.pop(fd, None)
                if peer is not None:
                    self._peer_fd.pop(peer, None)
                    self._perform(self.state.disconnected(peer, time.monotonic()))
