"""Every bound mpl puts on input from the network, in one place.

Each daemon faces drivers, workers and outsiders it does not trust, so every input has a
bound, checked where it enters (mostly while decoding) and refused with a
:class:`~mpl.wire.errors.ProtocolError` or a typed error naming the limit. Each limit below
says what it bounds and why its value is enough. Tests: ``tests/test_limits.py``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Any

from mpl.wire.errors import ProtocolError

__all__ = [
    "BIG",
    "BROKER_PROGRAM_BYTES",
    "INT_MAX",
    "INT_MIN",
    "MAX_CALLS",
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_DIGEST_CHARS",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_ITEMS",
    "MAX_HEARTBEAT_S",
    "MAX_JOB_SAVES",
    "MAX_JOB_THREADS",
    "MAX_LEASE_S",
    "MAX_MESSAGE",
    "MAX_MOVES_PENDING",
    "MAX_NESTING",
    "MAX_PERSISTED_NAMES",
    "MAX_PROGRAM_BYTES",
    "MAX_RUNTIME_INFO_ITEMS",
    "MAX_RUNTIME_INFO_TEXT",
    "MAX_RUNTIME_INFO_TOTAL",
    "MAX_SAME_HASH",
    "MAX_SESSIONS",
    "MAX_SESSION_SPECS_TOTAL",
    "MAX_SESSION_SYMBOLS",
    "MAX_SPU_PENDING",
    "MAX_SPU_PENDING_BYTES",
    "MIN_HEARTBEAT_S",
    "MIN_MAX_MESSAGE",
    "PROGRAM_MIRROR_BYTES",
    "WORKER_PROGRAM_BYTES",
    "BigInt",
    "check_lease",
    "check_ranks",
    "check_spread",
    "check_symbol_name",
    "heartbeat_ok",
    "int_fits",
    "job_timeout",
    "valid_name",
]

# -- one message --------------------------------------------------------------------------
# The largest frame a socket that carries values takes (libzmq's MAXMSGSIZE, per frame: a
# bigger one drops the connection, it is never buffered); `--max-message` changes it, down
# to MIN_MAX_MESSAGE. The broker announces its own (SessionOpened, Welcome) so that a
# driver or worker refuses a message over it before sending (MessageTooLargeError).
MAX_MESSAGE = 4 << 30
MIN_MAX_MESSAGE = 1024
# The header is msgpack; bulk data (arrays, bytes from 1 KiB) travels in frames, outside it,
# unbounded. 16 MiB holds a Python list of about 1.7 million floats.
MAX_HEADER_BYTES = 16 * 1024 * 1024
# Buffer frames one message may carry (each array or large byte string is one frame).
MAX_FRAMES = 1 << 16
# Items in one msgpack list or dict of a header: msgpack allocates room for them (8 bytes
# each) as soon as it reads the count, before the items arrive.
MAX_HEADER_ITEMS = 1 << 22
# Lists and dicts (msgpack's own containers) one header may build: 256 Ki, room for a list
# of that many records as dicts. An empty list is 1 byte on the wire and ~60 bytes in
# memory: without this bound a 2 MiB header of empty lists costs 129 MiB to refuse; with
# it, at most ~16 MiB of lists plus the 8 bytes per item above.
MAX_CONTAINERS = 1 << 18
# Lists and dicts nested in one another within one msgpack payload (each tuple, set or
# record starts a payload of its own, bounded by MAX_DEPTH). The encoder refuses the same,
# so what decodes always re-encodes (msgpack itself packs 511 levels at most).
MAX_NESTING = 100
# Keys of one map, or items of one set, that share one hash value. Python's dicts and sets
# compare a new key with every key of its hash already in, so N keys of one hash cost N**2/2
# comparisons to build: ints k * (2**61 - 1) + 1 (a BIGINT each), complex numbers, tuples of
# 64-bit ints whose last item is solved for the hash all collide at will, and a 1.4 MB map of
# 100,000 such keys held a decoding thread (the broker's loop) for minutes, a 16 MiB header
# for hours. Real keys share a hash a handful of times at most (64-bit ints: 9 each).
MAX_SAME_HASH = 32
# Codec extensions (tuples, records, sets) nested in one another: each is a separate
# msgpack payload and a level of the decoder's recursion.
MAX_DEPTH = 64
# Integers in record fields annotated ``int`` are 64-bit (as in msgpack): a 5,000-digit
# rank cannot even be printed in an error message. Fields that may hold more are declared
# ``BigInt``; values (``Any`` fields) carry ints of any size.
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
BIG = "big"
BigInt = Annotated[int, BIG]

# -- sessions and jobs ----------------------------------------------------------------------
# A session's lease: how long it outlives its drivers' silence. Finite, so it expires.
MAX_LEASE_S = 86_400.0

# -- tables keyed by network input -----------------------------------------------------------
# Sessions one broker holds open at once; beyond it OpenSession is refused.
MAX_SESSIONS = 10_000
# Calls (jobs, fetches, saves) the broker tracks in flight at once; beyond it new ones are
# refused until some finish.
MAX_CALLS = 100_000
# Names one session may hold (values saved without persist=True).
MAX_SESSION_SYMBOLS = 100_000
# Persisted names the broker's table lists (fed by workers' hellos and saves).
MAX_PERSISTED_NAMES = 100_000
# Peer moves waiting on a worker for their op (a move for a job that never comes waits
# here until its session closes); beyond it new moves are dropped and counted.
MAX_MOVES_PENDING = 100_000
# Job threads one worker runs (a session's tasks run on one of them at a time, in order):
# sessions beyond it wait for a free thread instead of each making one.
MAX_JOB_THREADS = 64
# libspu messages a worker keeps for receives that have not asked for them yet, in number
# and in bytes (a run consumes its messages as it goes; a flood for a real lane stops
# here); beyond either, new ones are dropped and counted (``spu_messages_dropped``).
MAX_SPU_PENDING = 100_000
MAX_SPU_PENDING_BYTES = 4 << 30
# Program caches, in bytes of encoded graphs (``mpl.wire.jobs.program_nbytes``) as well as
# in entries. One program may be at most MAX_PROGRAM_BYTES (functions with what they
# capture); the broker refuses a bigger one. The broker keeps the programs drivers sent in
# BROKER_PROGRAM_BYTES, and mirrors each worker's cache in PROGRAM_MIRROR_BYTES; a worker
# caches WORKER_PROGRAM_BYTES, at least the mirror, so whatever the broker believes a
# worker caches, it does (an LRU fed the same sequence with more room, counting each
# program no bigger, holds all the smaller one holds).
MAX_PROGRAM_BYTES = 256 << 20
# A program's digest: 32 hex characters (mpl.wire.decoder.frames_digest). A sealed one is
# its driver's word until a worker opens the program, and the caches above count a
# program's bytes, not its key's, so the broker and the worker refuse a longer one.
MAX_DIGEST_CHARS = 64
BROKER_PROGRAM_BYTES = 2 << 30
PROGRAM_MIRROR_BYTES = 1 << 30
WORKER_PROGRAM_BYTES = 2 << 30

# A node's runtime_info in a session's spec: it comes from a driver and travels to that
# node's worker when the session opens. A few dozen keys and bindings describe any runtime:
# at most MAX_RUNTIME_INFO_ITEMS keys, values and container entries in all, and
# MAX_RUNTIME_INFO_TEXT characters of text (op_bindings included).
MAX_RUNTIME_INFO_ITEMS = 1024
MAX_RUNTIME_INFO_TEXT = 64 * 1024
# What a worker keeps of all open sessions' runtime_info together, weighed as
# ``runtime_info.info_weight`` does (its text, and 64 a key or value): sessions bringing
# the same runtime_info share one copy; an open past it is refused (a hostile broker could
# otherwise have a worker keep 64 KiB of text for each of MAX_SESSIONS sessions).
MAX_RUNTIME_INFO_TOTAL = 16 << 20
# What a broker keeps of all open sessions' own specs together (``mp.connect(url,
# cluster=spec)``: each named node's runtime_info, the session's devices), weighed as
# ``runtime_info.info_weight`` does: sessions opened with equal specs share one copy; an
# open past it is refused (drivers could otherwise have it keep some 190 KiB of text per
# session of a 3-node cluster, for each of MAX_SESSIONS sessions).
MAX_SESSION_SPECS_TOTAL = 64 << 20


# A saved value's name: it becomes a file name on the workers that persist it, so it can
# never climb out of their data root (``sym:../x``).
_SYMBOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")  # \Z: no final newline


# Names one rank may save inside one job (``save`` ops), and so list in its ``Done``: the
# broker reads that list, so it is bounded like every table the broker fills.
MAX_JOB_SAVES = 1024


def check_symbol_name(name: str) -> str:
    """``name`` if it is a valid value name, else ``ValueError`` saying what is allowed."""
    if type(name) is not str or not _SYMBOL_NAME.match(name):
        raise ValueError(
            f"bad value name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def valid_name(name: str) -> bool:
    """True if ``check_symbol_name`` accepts ``name``."""
    return type(name) is str and _SYMBOL_NAME.match(name) is not None


def check_spread(keys: Iterable[Any], what: str) -> None:
    """Refuse (``ProtocolError``) keys of one map or set (``what``) of which more than
    ``MAX_SAME_HASH`` share one hash value: building it would cost the square of their
    number. The hashes are counted in a dict of ints, whose own hashes collide 9 times at
    most. ``TypeError`` for an unhashable key, as building the map would raise."""
    counts = Counter(map(hash, keys))
    if counts and max(counts.values()) > MAX_SAME_HASH:
        raise ProtocolError(
            f"a {what} holds more than {MAX_SAME_HASH} keys that share one hash value (a "
            "hash-collision flood: building it would cost the square of their number)"
        )


def int_fits(value: Any) -> bool:
    """True for an int (not a bool) within the 64-bit range of record fields."""
    return type(value) is int and INT_MIN <= value <= INT_MAX


# A heartbeat interval a worker takes from its broker's Welcome: the broker's word, so
# bounded (NaN, infinity or 1e300 made the worker's next wait unrepresentable and stopped
# its I/O thread; 0 or less had it give up on the broker at every turn)
MIN_HEARTBEAT_S = 0.01
MAX_HEARTBEAT_S = 3600.0


def heartbeat_ok(heartbeat_s: object) -> bool:
    """True for a number of seconds within [MIN_HEARTBEAT_S, MAX_HEARTBEAT_S] (so finite)."""
    if type(heartbeat_s) is not float and type(heartbeat_s) is not int:
        return False
    return MIN_HEARTBEAT_S <= heartbeat_s <= MAX_HEARTBEAT_S  # NaN compares False


def check_lease(lease_s: float) -> str | None:
    """Why ``lease_s`` is refused, or None: it must be within (0, 1 day]."""
    if not (isinstance(lease_s, (int, float)) and math.isfinite(lease_s)):
        return f"lease_s must be a finite number of seconds, got {lease_s!r}"
    if not 0 < lease_s <= MAX_LEASE_S:
        return f"lease_s must be within (0, {MAX_LEASE_S:g}] seconds, got {lease_s:g}"
    return None


def check_ranks(ranks: tuple[int, ...], what: str) -> str | None:
    """Why a request for ``ranks`` is refused, or None: it names at least one rank, once."""
    if not ranks:
        return f"{what} names no rank: it would wait for nobody's answer"
    if len(set(ranks)) != len(ranks):
        return f"{what} names a rank twice: {list(ranks)}"
    return None


def job_timeout(timeout_s: float, cap_s: float) -> float:
    """The seconds a worker gives a job that asked for ``timeout_s``: its own
    ``--job-timeout`` (``cap_s``) at most, and that for 0. NaN, infinite or negative
    requests raise ``ValueError``."""
    if not math.isfinite(timeout_s) or timeout_s < 0:
        raise ValueError(
            f"timeout_s must be 0 (the worker's default) or a finite number of seconds, "
            f"got {timeout_s!r}"
        )
    return min(timeout_s, cap_s) if timeout_s > 0 else cap_s
