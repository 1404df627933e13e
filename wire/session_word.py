"""A session's owner's word on who the session admits, as it travels sealed (secure mode).

Only the broker learns ``share_with`` when a session opens, and the broker may be hostile.
So the driver that owns a session tells each worker itself, inside the bindings it seals
for it (authenticated by its key, bound to the session and job by the Exec context). The
owner's word is a *grant*: who the session admits, stamped with when the owner made it
(:func:`grant_stamp`, wall-clock nanoseconds, taken once per ``mp.connect`` that passes
``share_with``); a worker keeps the grant with the highest stamp it has seen, never going
back to an older one (``mpl.worker.admission``). The stamp is sealed with the list, so the
broker can neither change it nor make an old grant new; it can only hold a job back, and
a job held back carries the older grant, which loses. Nor does an older grant admitting
others bind anew what a worker forgot (its restart, an evicted binding): a worker's mark
per owner, ``SessionAdmission.forgotten``.

* a job of the owner of a session it opened without ``share_with`` (never shared) carries
  no word: its bindings are a list or None, as always (and a sealed None keeps the
  worker's short path). That is the owner's word "this session admits me alone" as it
  opened it: binding a session on a worker, a grant of the owner alone stamped with that
  worker's clock (a later stamped grant overrides it, an older one does not); and
  such a job runs only where the newest grant admits its owner alone (under one admitting
  others its client's view is stale, or the broker gave its open another session's id);
* a job of a client of the owner that passed ``share_with`` (opening, or re-attaching:
  ``[]`` takes the sharing back) carries ``{"admits": [...], "granted": stamp,
  "inputs": ...}``: the driver identities admitted, sorted, the owner among them, and the
  grant's stamp (every job of that client restates the same grant); a client whose open
  the broker answered as a new session (not attached) adds ``"opening": true``: a worker
  lets such a grant bind only a session it does not hold yet, or restate itself, never
  replace another binding (the broker could give the open an old session's id);
* a job of any other driver in the session (a sharee, or a client of the owner that
  attached without ``share_with`` and so cannot tell it is the owner) carries
  ``{"admits": None, "inputs": ...}``: it claims no say over who the session admits, and
  runs only where the owner's grant admits it.

The session's id names its owner (:func:`session_id`): a worker lets no other driver's job
bind the session, by any of these words (``mpl.worker.admission``), and a driver refuses an
id naming another owner for a session it owns (``mpl.driver.client``).

A worker older than the stamp refuses a grant (three keys) as malformed; a worker of this
kind refuses an older driver's unstamped list the same way (``ProtocolError``). Jobs
without a word, and members' words, read the same on both.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from base64 import urlsafe_b64encode
from typing import Any

from mpl.wire.errors import ProtocolError

__all__ = [
    "MAX_ADMITTED",
    "MAX_STAMP",
    "binds_owner",
    "grant_stamp",
    "id_of_session_named",
    "read_word",
    "session_id",
    "worded",
]

MAX_ADMITTED = 1024  # drivers one session may admit (a bound: the word is network input)
MAX_STAMP = (1 << 63) - 1  # a grant's stamp: a positive int up to this (nanoseconds)
_ADMITS, _GRANTED, _INPUTS, _OPENING = "admits", "granted", "inputs", "opening"
_MEMBER_KEYS = frozenset((_ADMITS, _INPUTS))
_GRANT_KEYS = frozenset((_ADMITS, _GRANTED, _INPUTS))
_OPENING_KEYS = _GRANT_KEYS | {_OPENING}  # a grant flagged: its session opened anew
_stamped = [0]  # the last stamp this process gave (grant_stamp)
_stamping = threading.Lock()
_NONCE_BYTES, _TAG_BYTES = 6, 12  # an id's tail: a random part, then its owner's tag
_NONCE_CHARS = _NONCE_BYTES * 4 // 3  # base64url, both multiples of 3 bytes: no padding
_TAIL_CHARS = _NONCE_CHARS + _TAG_BYTES * 4 // 3
_ID_TAIL = re.compile(rf"~[A-Za-z0-9_-]{{{_TAIL_CHARS}}}")
_OWNER_PERSON = b"mpl-sess-owner/1"  # keeps these hashes apart from any other BLAKE2b use


def _owner_tag(owner: str, name: str, nonce: str) -> str:
    """The tag of a session id naming ``owner``: a 96-bit BLAKE2b hash of the owner's
    identity, the session's name (each after its length) and the id's random part, in
    base64url. The broker draws that part (48 bits): a nonce under which two drivers' tags
    agree, or a driver name whose tag agrees with another's, costs it about 2**96 tries."""
    fields = f"{len(owner)}:{owner}|{len(name)}:{name}|{nonce}".encode()
    digest = hashlib.blake2b(fields, digest_size=_TAG_BYTES, person=_OWNER_PERSON).digest()
    return urlsafe_b64encode(digest).decode()


def session_id(name: str, owner: str) -> str:
    """A new id for the session called ``name`` that the driver identity ``owner`` opens:
    ``<name>~<8 random characters><16 naming the owner>`` (base64url; the broker's choice
    of its random part). The word binds to the id, so a driver checks it names the
    session it asked for; and the id names its owner, so a worker lets no other driver
    bind it (:func:`binds_owner`) and a driver checks that a session it opened is its own.

    24 characters, 16 more than a random tail alone: a Done's context writes the session
    out (``done|session|job|index``), and a trivial job's box tag input, for a session a
    driver named itself (``s<16 hex>``), stays within one BLAKE2b block
    (``mpl.wire.seal_box``); hex, 32 more, took it to two."""
    nonce = urlsafe_b64encode(secrets.token_bytes(_NONCE_BYTES)).decode()
    return f"{name}~{nonce}{_owner_tag(owner, name, nonce)}"


def id_of_session_named(sid: str, name: str) -> bool:
    """Whether ``sid`` is an id :func:`session_id` gives the session called ``name``."""
    return sid.startswith(name) and _ID_TAIL.fullmatch(sid, len(name)) is not None


def binds_owner(sid: str, driver: str) -> bool:
    """Whether ``driver`` may own session ``sid``: the id names it as its owner, or names
    no owner (not of :func:`session_id`'s form: an id no driver of this kind acts in, as
    it checks every id it is answered with). Read from the end: the tail, then the name."""
    cut = len(sid) - _TAIL_CHARS
    if cut < 1 or _ID_TAIL.fullmatch(sid, cut - 1) is None:
        return True
    nonce = sid[cut : cut + _NONCE_CHARS]
    return sid[cut + _NONCE_CHARS :] == _owner_tag(driver, sid[: cut - 1], nonce)


def grant_stamp() -> int:
    """A stamp for a grant made now: wall-clock nanoseconds, so grants the owner makes
    from different clients (processes, machines) order as they were made, as far as their
    clocks agree; above every stamp this process gave before, so its own grants always
    order, even if its clock steps back."""
    with _stamping:
        stamp = _stamped[0] = max(time.time_ns(), _stamped[0] + 1)
    return stamp


def worded(
    inputs: Any, admits: list[str] | None, granted: int = 0, opening: bool = False
) -> dict[str, Any]:
    """A rank's bindings ``inputs`` (a list or None) with a word: the owner's grant
    (``admits``, the sorted identities admitted, stamped ``granted``; ``opening``: made by
    a client whose open the broker answered as a new session), or, for ``admits=None``, a
    member's, claiming no say."""
    if admits is None:
        return {_ADMITS: None, _INPUTS: inputs}
    if opening:
        return {_ADMITS: admits, _GRANTED: granted, _OPENING: True, _INPUTS: inputs}
    return {_ADMITS: admits, _GRANTED: granted, _INPUTS: inputs}


def read_word(plain: dict[Any, Any]) -> tuple[frozenset[str] | None, int, bool, Any]:
    """``(admitted identities or None, the grant's stamp, whether it is flagged as opening
    its session, inputs)`` from bindings that carry a word (a member's: None, 0, False);
    raises ``ProtocolError`` for anything else (only a listed driver can seal it: still
    checked)."""
    keys = plain.keys()
    if keys == _MEMBER_KEYS:
        if plain[_ADMITS] is not None:
            raise ProtocolError(
                "a session's word names its drivers without the stamp of the grant (sealed "
                "by a driver older than this worker?)"
            )
        return None, 0, False, plain[_INPUTS]
    opening = keys == _OPENING_KEYS
    if opening and plain[_OPENING] is not True:
        raise ProtocolError("a session's grant flags its opening other than by true")
    if not opening and keys != _GRANT_KEYS:
        raise ProtocolError("a job's sealed bindings are neither a list nor a session's word")
    admits, stamp = plain[_ADMITS], plain[_GRANTED]
    if type(stamp) is not int or not 0 < stamp <= MAX_STAMP:
        raise ProtocolError("a session's grant is stamped other than by a positive int64")
    if (
        type(admits) is not list
        or len(admits) > MAX_ADMITTED
        or not all(type(who) is str for who in admits)
    ):
        raise ProtocolError("a session's word names its drivers other than as a list of names")
    return frozenset(admits), stamp, opening, plain[_INPUTS]
