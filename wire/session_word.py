"""A session's owner's word on who the session admits, as it travels sealed (secure mode).

Only the broker learns ``share_with`` when a session opens, and the broker may be hostile.
So the driver that owns a session tells each worker itself, inside the bindings it seals
for it (authenticated by its key, bound to the session and job by the Exec context):

* a job of the owner of a session that admits no one else carries no word: its bindings
  are a list or None, as always (and a sealed None keeps the worker's short path). That is
  the owner's word "this session admits me alone";
* a job of the owner of a shared session carries ``{"admits": [...], "inputs": ...}``: the
  driver identities the session admits, sorted, the owner among them;
* a job of any other driver in the session (a sharee, or a client of the owner that
  attached without ``share_with`` and so cannot tell it is the owner) carries
  ``{"admits": None, "inputs": ...}``: it claims no say over who the session admits, and
  runs only where the owner's word already admits it (``mpl.worker.admission``).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from mpl.wire.errors import ProtocolError

__all__ = ["MAX_ADMITTED", "id_of_session_named", "read_word", "session_id", "worded"]

MAX_ADMITTED = 1024  # drivers one session may admit (a bound: the word is network input)
_ADMITS, _INPUTS = "admits", "inputs"
_ID_TAIL = re.compile(r"~[0-9a-f]{16}")


def session_id(name: str) -> str:
    """A new id for the session called ``name`` (the broker's choice of its random part):
    the word binds to the id, so a driver checks it names the session it asked for."""
    return f"{name}~{secrets.token_hex(8)}"


def id_of_session_named(sid: str, name: str) -> bool:
    """Whether ``sid`` is an id :func:`session_id` gives the session called ``name``."""
    return sid.startswith(name) and _ID_TAIL.fullmatch(sid, len(name)) is not None


def worded(inputs: Any, admits: list[str] | None) -> dict[str, Any]:
    """A rank's bindings ``inputs`` (a list or None) with the word ``admits`` (the sorted
    identities a session's owner admits, or None: a member's, claiming none)."""
    return {_ADMITS: admits, _INPUTS: inputs}


def read_word(plain: dict[Any, Any]) -> tuple[frozenset[str] | None, Any]:
    """``(admitted identities or None, inputs)`` from bindings that carry a word; raises
    ``ProtocolError`` for anything else (only a listed driver can seal it: still checked)."""
    if plain.keys() != {_ADMITS, _INPUTS}:
        raise ProtocolError("a job's sealed bindings are neither a list nor a session's word")
    admits = plain[_ADMITS]
    if admits is None:
        return None, plain[_INPUTS]
    if (
        type(admits) is not list
        or len(admits) > MAX_ADMITTED
        or not all(type(who) is str for who in admits)
    ):
        raise ProtocolError("a session's word names its drivers other than as a list of names")
    return frozenset(admits), plain[_INPUTS]
