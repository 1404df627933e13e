"""Named values: save, load and delete a name in a session (or on the workers' disks).

``SaveSymbol`` and ``DeleteSymbol`` fan out to the ranks holding the value, each answers
with an ``Ack`` (counted only from those ranks), and the driver gets one ``Reply``.
``LoadSymbol`` is answered from the broker's tables; loading a persisted name is also what
lets the session read it (``sym:<name>``) from then on. Persisted names are per party
(:mod:`mpl.broker.persisted`): a load or delete says whose, or the holders must make one
value. In secure mode a load or delete sees only what the session's owner persisted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mpl.broker.actions import Send
from mpl.broker.admission import refuse_call, refuse_save
from mpl.broker.calls import RequestCall
from mpl.broker.session_runtime import OPEN_KIND
from mpl.broker.sessions import SessionEntry
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo
from mpl.wire.sessions import Ack, DeleteSymbol, LoadSymbol, Reply, SaveSymbol, SymbolInfo

if TYPE_CHECKING:
    from mpl.broker.state import BrokerState

__all__ = ["Names"]


class Names:
    """The name handlers of one :class:`~mpl.broker.state.BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self.state = state

    def _fan_out(
        self,
        peer: bytes,
        sid: str,
        req: int,
        ranks: tuple[int, ...],
        kind: str,
        now: float,
        make: Callable[[int], Record],
        symbol: SymbolInfo | None = None,
    ) -> list[Send]:
        for rank in ranks:
            if rank not in self.state.registry.by_rank:
                return [Send(peer, Reply(req, error=self.state._absent(rank)))]
        if (busy := refuse_call(self.state.calls)) is not None:
            return [Send(peer, self.state._req_error(req, "ProtocolError", busy))]
        bid = self.state.calls.new_req()
        self.state.calls.requests[bid] = RequestCall(
            peer, sid, ranks, set(ranks), req=req, bid=bid, kind=kind, symbol=symbol
        )
        message = make(bid)
        return [Send(self.state.registry.by_rank[r].peer, message) for r in ranks]

    def on_save(
        self, peer: bytes, msg: SaveSymbol, now: float, who: str | None = None
    ) -> list[Send]:
        session = self.state.access.session(peer, who, msg.session, now)
        if isinstance(session, ErrorInfo):
            return [Send(peer, Reply(msg.req, error=session))]
        if not session.may_read(msg.uri):
            return [Send(peer, Reply(msg.req, error=self.state.access.unloaded(session, msg.uri)))]
        if (refusal := refuse_save(msg.info, session.symbols)) is not None:
            return [Send(peer, self.state._req_error(msg.req, "ProtocolError", refusal))]
        return self._fan_out(
            peer,
            msg.session,
            msg.req,
            msg.info.ranks,
            "save",
            now,
            lambda bid: SaveSymbol(msg.session, bid, msg.uri, msg.info),
            msg.info,
        )

    def on_load(
        self, peer: bytes, msg: LoadSymbol, now: float, who: str | None = None
    ) -> list[Send]:
        session = self.state.access.session(peer, who, msg.session, now)
        if isinstance(session, ErrorInfo):
            return [Send(peer, Reply(msg.req, error=session))]
        info = self._resolve(session, msg.name, tuple(msg.parties))
        if isinstance(info, ErrorInfo):
            return [Send(peer, Reply(msg.req, error=info))]
        if info is None:
            viewer = self.state.access.driver(peer, who) or ""
            persisted = self.state.persisted.names(viewer if self.state.secure else None)
            known = sorted({*session.symbols, *persisted})  # (secure: only the caller's own)
            where = f" on rank(s) {list(msg.parties)}" if msg.parties else ""
            error = ErrorInfo(
                "SessionError",
                f"no value named {msg.name!r}{where} in this session or on disk; "
                f"known names: {', '.join(known) or 'none'}",
            )
            return [Send(peer, Reply(msg.req, error=error))]
        if msg.name not in session.symbols:
            session.loaded.add(msg.name)  # from now on this session may read it
        return [Send(peer, Reply(msg.req, value=info))]

    def _resolve(
        self, session: SessionEntry, name: str, parties: tuple[int, ...]
    ) -> SymbolInfo | ErrorInfo | None:
        """The session's own value first (when it is on the ranks asked for), else what
        those parties persisted under ``name``, each in its own namespace (secure mode:
        what the session's owner persisted, anyone else's being as if absent)."""
        symbols = session.symbols
        own = symbols.get(name)
        if own is not None and (not parties or set(parties) == set(own.ranks)):
            return own
        # secure: only the session owner's entries, as the workers read them only there
        owner = session.owner if self.state.secure else None
        return self.state.persisted.resolve(name, parties, owner)

    def on_unsave(
        self, peer: bytes, msg: DeleteSymbol, now: float, who: str | None = None
    ) -> list[Send]:
        session = self.state.access.session(peer, who, msg.session, now)
        if isinstance(session, ErrorInfo):
            return [Send(peer, Reply(msg.req, error=session))]
        info = self._resolve(session, msg.name, tuple(msg.ranks))
        if isinstance(info, ErrorInfo):
            return [Send(peer, Reply(msg.req, error=info))]
        uri = f"sym:{msg.name}"
        if info is not None and not session.may_read(uri):
            return [Send(peer, Reply(msg.req, error=self.state.access.unloaded(session, uri)))]
        if info is None:
            return [
                Send(
                    peer,
                    Reply(
                        msg.req,
                        error=ErrorInfo("SessionError", f"no value named {msg.name!r} to delete"),
                    ),
                )
            ]
        return self._fan_out(
            peer,
            msg.session,
            msg.req,
            info.ranks,
            "unsave",
            now,
            lambda bid: DeleteSymbol(msg.session, bid, msg.name, info.ranks, info.persist),
            info,
        )

    def on_ack(self, peer: bytes, msg: Ack, now: float, who: str | None = None) -> list[Send]:
        if not self.state.access.speaks_for(peer, who, msg.rank, msg.TAG):
            return []
        call = self.state.calls.requests.get(msg.req)
        if call is None or call.kind == "fetch":
            return []
        if msg.rank not in call.pending:
            self.state.access.forged(f"an ack for rank(s) {call.ranks} from rank {msg.rank}")
            return []
        if call.kind == OPEN_KIND:  # a session's node accepting (or refusing) it
            return self.state.runtimes.acked(call, msg)
        if msg.error is not None:
            return self.state._fail_call(call, msg.error)
        call.pending.discard(msg.rank)
        if call.pending:
            return []
        del self.state.calls.requests[msg.req]
        info = call.symbol
        session = self.state.sessions.get(call.session)
        if info is not None:
            symbols = session.symbols if session is not None else {}
            if call.kind == "save" and info.persist:
                # each rank's own entry; the broker's word names no owner (a secure worker
                # refuses a SaveSymbol: this is a plaintext save, whose owner nobody lists by)
                self.state.persisted.saved(info, call.ranks)
            elif call.kind == "save":
                symbols[info.name] = info
            else:
                if info.persist:
                    self.state.persisted.deleted(info.name, call.ranks)
                symbols.pop(info.name, None)
        return [Send(call.driver, Reply(call.req))]
