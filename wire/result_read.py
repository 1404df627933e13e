"""The driver's decoder for what the broker answers: ``JobResult`` on a lean path.

Every job ends with one ``JobResult``, so the driver decodes one per job. The general
:func:`mpl.wire.codec.decode` checks its six fields with predicates compiled from their
annotations (about half of the decode's time); here the same checks are written out for this
one record. Everything else is as in ``decode``: the same frame, magic and size limits, the
same :class:`~mpl.wire.decoder.Decoder` (safe mode refuses pickles, buffer indexes checked,
nesting and container counts bounded), and every buffer frame must be referenced. The
message comes from the broker, which packs the workers' values into it: nothing in it is
trusted. Any other message goes to ``decode``.

A short result without buffer frames (a trivial job's: a few scalars, or sealed boxes in
secure mode) is read by msgpack alone, without a ``Decoder`` (two Python calls and its
state): with no buffers there is nothing to index or account for, the container count is
bounded as the Decoder bounds it (:func:`_counted_length`), the only extension read
there is the Decoder's own short tuple of small ints, and no map may hold more keys than
``MAX_SAME_HASH`` (a longer one goes to the Decoder, which counts its hashes: keys of one
hash cost the square of their number to build, so this is the Decoder's own bound, met
without counting). A job over more ranks than that has per-rank maps as long by right:
such a header is read again by msgpack alone, each map's pairs checked before it is built
(:func:`_wide`): a long map whose keys are all ints is built (64-bit ints share a hash 13
times at most, so they cannot flood one), one with any other key sends the header to the
Decoder. Any other extension (an error's
``ErrorInfo``, a pickle, a nested tuple) sends the header to the ``Decoder`` after all, so
both paths accept and build exactly the same. What msgpack alone read is checked without
range checks (its ints are all 64-bit) and with exact types (it builds exact dicts and strs).

A caller that knows which job's answer it waits for (a driver's call site,
:mod:`mpl.driver.job_site`) reads it with :func:`answer_fields` (the one frame it receives)
or :func:`result_fields` (frames): the header must start with that job's bytes (one
comparison instead of a field check), and the fields come back as the list msgpack built,
without the record (:func:`read_result` builds it, for tests and other callers). Anything
else it leaves to the caller's general reading. It bounds nesting by the
fields it read rather than by a count of the header's bytes: in a result that fits, only
the values themselves can nest (stats are blobs, metas strs), so one with no list or dict
among them needs no count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import zmq

from mpl.wire.codec import MAGIC_FRAME, decode
from mpl.wire.decoder import TUPLE, Decoder
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import JobResult
from mpl.wire.limits import (
    INT_MAX,
    INT_MIN,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    MAX_HEADER_ITEMS,
    MAX_NESTING,
    MAX_SAME_HASH,
)
from mpl.wire.record import Record, pinned_fields
from mpl.wire.remote import ErrorInfo
from mpl.wire.run_stats import MAX_STATS_BYTES

__all__ = [
    "RESULT_HEAD",
    "answer_fields",
    "read_answer",
    "read_result",
    "refused_answer_job",
    "result_fields",
]

# Written out by hand in read_answer and _fits: a changed JobResult would otherwise be read
# wrong, or fall back to decode on every answer, silently. Filled in directly (direct).
_FIELDS = pinned_fields(
    JobResult,
    ("job", "values", "error", "missing_program", "stats", "metas"),
    "mpl.wire.result_read",
    direct=True,
)
# msgpack's list and map markers: fixmap, fixarray, array 16/32, map 16/32
_CONTAINER_MARKERS = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_COUNT_BELOW = 8192  # longer headers are counted by the Decoder's hooks, as decode does
# a header read by msgpack alone is shorter than _COUNT_BELOW, so it holds no stats blob
# longer than MAX_STATS_BYTES: only _fits (a longer header's) needs to look at their sizes
if _COUNT_BELOW > MAX_STATS_BYTES:
    raise ImportError("result_read: _COUNT_BELOW must stay within MAX_STATS_BYTES")
_MISMATCH = f"record {JobResult.TAG!r}: a field does not match its annotation"
# a fixarray of the tag and six fields, then the tag as a fixstr
_PREFIX = b"\x97" + bytes([0xA0 | len(JobResult.TAG)]) + JobResult.TAG.encode()
RESULT_HEAD = _PREFIX  # what every JobResult's header starts with: its job id follows


def read_answer(frames: Sequence[Any], *, safe: bool) -> Record:
    """``decode(frames, safe=safe)``, faster for a ``JobResult``; raises ProtocolError for
    anything malformed, as ``decode`` does."""
    if len(frames) == 2 and type(frames[0]) is bytes and type(header := frames[1]) is bytes:
        # a header cut from its frame, or split from a batch (most answers): the checks
        # below and _counted_length's count on the bytes themselves, without a view or copy
        size = len(header)
        if frames[0] != MAGIC_FRAME or size > MAX_HEADER_BYTES or not header.startswith(_PREFIX):
            return decode(frames, safe=safe)
        few = size < _COUNT_BELOW and (
            size - len(header.translate(None, _CONTAINER_MARKERS)) < MAX_NESTING
        )
        counted = 0 if few else size
    else:
        if len(frames) < 2 or len(frames) - 2 > MAX_FRAMES:
            return decode(frames, safe=safe)
        try:
            header = frames[1]
            view = memoryview(header)
            magic = memoryview(frames[0]).tobytes()
        except TypeError:
            return decode(frames, safe=safe)
        if (
            magic != MAGIC_FRAME
            or view.nbytes > MAX_HEADER_BYTES
            or view[: len(_PREFIX)].tobytes() != _PREFIX
        ):
            return decode(frames, safe=safe)
        counted = _counted_length(view)
    items: Any = _NOT_READ
    unused = 0  # buffer frames the header does not reference
    try:
        if counted == 0 and len(frames) == 2:  # no buffers, few containers: msgpack alone
            try:
                items = msgpack.unpackb(
                    header,
                    ext_hook=_short_tuple,
                    strict_map_key=False,
                    raw=False,
                    max_array_len=MAX_HEADER_ITEMS,
                    max_map_len=MAX_SAME_HASH,
                )
            except _NeedsDecoder:  # an extension only the Decoder reads
                items = _NOT_READ
            except ValueError as exc:  # a map past MAX_SAME_HASH keys: a wide job's
                # per-rank maps, read wide if their keys are ints (malformed: the
                # Decoder says so)
                items = _wide(header) if type(exc) is ValueError else _NOT_READ
        plain = items is not _NOT_READ
        if not plain:
            items, unused = _decoded(frames, header, safe, counted)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack and numpy errors mean "malformed", as in decode
        raise ProtocolError(f"malformed header: {type(exc).__name__}: {exc}") from exc
    if plain:  # msgpack alone: a list of seven (the prefix), see result_fields
        _, job, values, error, missing, stats, metas = items
        fits = type(job) is str and error is None and _fits_plain(values, missing, stats, metas)
    else:
        fits = _fits(items)
    if not fits:
        raise ProtocolError(_MISMATCH)
    if unused:
        raise ProtocolError(f"{unused} buffer frame(s) not referenced by the header")
    # filled in with keywords, as _FIELDS pins them: no slice or zip, and (unlike a dict
    # filled key by key or from a zip) a __dict__ whose fields every reader later loads
    # at the interpreter's specialised speed
    _, job, values, error, missing, stats, metas = items
    rec = object.__new__(JobResult)
    rec.__dict__.update(
        job=job, values=values, error=error, missing_program=missing, stats=stats, metas=metas
    )
    return rec


def read_result(frames: Sequence[Any], job: bytes, *, safe: bool) -> Record | None:
    """``read_answer(frames, safe=safe)`` for ``job``'s JobResult, for a caller that knows
    which job's answer it waits for (``job``: its id as msgpack packs it, a fixstr for
    any id up to 31 characters); None for what is not read here (another message, or
    frames other than a magic and a header as ``bytes`` or ``zmq.Frame``): the caller reads
    it the general way. See :func:`result_fields`, which reads it."""
    fields = result_fields(frames, RESULT_HEAD + job, safe=safe)
    if fields is None:
        return None
    _, job_id, values, error, missing, stats, metas = fields
    rec = object.__new__(JobResult)  # as read_answer fills it in
    rec.__dict__.update(
        job=job_id, values=values, error=error, missing_program=missing, stats=stats, metas=metas
    )
    return rec


def result_fields(frames: Sequence[Any], head: bytes, *, safe: bool) -> list[Any] | None:
    """:func:`read_result`'s record as the list msgpack reads, ``[tag, job, values, error,
    missing_program, stats, metas]``, for a caller that reads the fields at once (building
    the record costs about as much as checking them); None as in ``read_result``. ``head``:
    ``RESULT_HEAD`` and the job id as msgpack packs it (a caller builds it in one go).

    A header that starts with ``head`` is this job's result;
    a short one is read with one copy, one comparison and one msgpack call, and anything
    else in it goes to ``read_answer``, as would the whole message."""
    if len(frames) != 2:
        return None
    magic, header = frames
    if type(header) is zmq.Frame:
        data = header.bytes
        magic = magic.bytes if type(magic) is zmq.Frame else magic
    elif type(header) is bytes:
        data = header
    else:
        return None
    if magic == MAGIC_FRAME:  # as one frame: read as the driver reads what it receives
        return answer_fields(MAGIC_FRAME + data, head, safe=safe)
    if not data.startswith(head):
        return None
    return _fields_of(read_answer(frames, safe=safe))  # which refuses its magic


def answer_fields(one: bytes, head: bytes, *, safe: bool, alone: bool = False) -> list[Any] | None:
    """:func:`result_fields` of a message as it arrives in one frame (wire v4: the magic,
    then the header, no buffer frames), as the driver receives a job's answer: the header
    is cut from it once, and only once it starts with ``head`` (this job's).

    ``alone``: the caller has not asked whether more frames follow ``one`` (that costs a
    driver as much as the rest of the read): only a header msgpack reads alone is read
    (no extension: an honest message's buffer frames are referenced by extensions, so one
    read so has none), and None comes back for any other, which the caller then reads
    whole, its frames received (:func:`result_fields`)."""
    if not one.startswith(head, 4):
        return None
    # a short header is read by msgpack alone (bounded: fewer than _COUNT_BELOW bytes build
    # fewer containers than that, nested at most as deep as msgpack's own stack); whether it
    # nests too deep is judged below, once its fields are known
    if not one.startswith(MAGIC_FRAME) or len(one) - 4 >= _COUNT_BELOW:
        return None if alone else _fields_of(read_answer([one[:4], one[4:]], safe=safe))
    data = one[4:]
    try:
        items: list[Any] = msgpack.unpackb(
            data,
            ext_hook=_short_tuple,
            strict_map_key=False,
            raw=False,
            max_array_len=MAX_HEADER_ITEMS,
            max_map_len=MAX_SAME_HASH,
        )
    # an extension only the Decoder reads, or a map of more keys than MAX_SAME_HASH, whose
    # hashes the Decoder counts (msgpack's own ValueError; a malformed header's are its
    # subclasses, and the Decoder would say the same of them)
    except _NeedsDecoder:
        return None if alone else _fields_of(read_answer([one[:4], data], safe=safe))
    except ValueError as exc:
        if type(exc) is not ValueError:
            raise ProtocolError(f"malformed header: {type(exc).__name__}: {exc}") from exc
        # a map past MAX_SAME_HASH keys: a job over more ranks than that has per-rank maps
        # that long by right, read wide if their keys are ints (_wide)
        wide = _wide(data)
        if wide is _NOT_READ:
            return None if alone else _fields_of(read_answer([one[:4], data], safe=safe))
        items = wide
    except Exception as exc:  # msgpack's errors mean "malformed", as in decode
        raise ProtocolError(f"malformed header: {type(exc).__name__}: {exc}") from exc
    # a fixarray of seven (the prefix), its job id a str (the prefix too), no ErrorInfo (an
    # extension: the Decoder's), every int 64-bit (msgpack's own range), dicts exact:
    # _fits_plain's checks, written out here with the pass over the values that looks for
    # nesting (one call and one walk of the values fewer on every job's answer)
    _, _, values, error, missing, stats, metas = items
    if (
        error is not None
        or type(values) is not dict
        or type(stats) is not dict
        or type(metas) is not dict
        or type(missing) is not bool
    ):
        raise ProtocolError(_MISMATCH)
    nests = False  # a list or dict among the values themselves
    for index in values:  # dict[int, dict[int, Any]]
        by_rank = values[index]
        if type(index) is not int or type(by_rank) is not dict:
            raise ProtocolError(_MISMATCH)
        for rank in by_rank:
            if type(rank) is not int:
                raise ProtocolError(_MISMATCH)
            kind = type(by_rank[rank])
            # what msgpack builds that nests (its tuples here: of small ints), by identity:
            # `in (list, dict)` compares the types with ==, about a fifth of a rank's checks
            if kind is list or kind is dict:
                nests = True
    # dict[int, bytes]: each rank's blob, read on demand (run_stats); none is longer than
    # MAX_STATS_BYTES in a header this short (a longer one is read_answer's: _fits checks)
    for rank in stats:
        if type(rank) is not int or type(stats[rank]) is not bytes:
            raise ProtocolError(_MISMATCH)
    for index in metas:  # dict[int, str]
        if type(index) is not int or type(metas[index]) is not str:
            raise ProtocolError(_MISMATCH)
    # Fields that fit nest three deep (the header, values, a rank's map) but for the values
    # themselves (stats are blobs, metas strs): with no list or dict among those, the header
    # is within MAX_NESTING, and its markers need no count (a pass over every byte: more
    # than the rest of the read for a trivial job's answer, per rank). Otherwise the count
    # of _counted_length decides, and a header it does not clear goes to the Decoder.
    if nests and len(data) - len(data.translate(None, _CONTAINER_MARKERS)) >= MAX_NESTING:
        return None if alone else _fields_of(read_answer([one[:4], data], safe=safe))
    return items


def _decoded(frames: Sequence[Any], header: Any, safe: bool, counted: int) -> tuple[Any, int]:
    """``header`` read by a :class:`Decoder` over the buffer frames, and how many of those
    it left unreferenced. Uncounted (``counted`` 0: few containers) its maps may hold at
    most ``MAX_SAME_HASH`` keys, which no keys can flood one hash of (the check the counting
    Decoder makes on a longer map, ``check_spread``): 8 KiB of BIGINT, complex or tuple
    keys of one hash in one map cost the square of their number (red team w31, R1). A
    longer map has the header read again by a counting Decoder, which checks it; so does
    a pickle (trusted answers), met by the uncounted read before it loads it: a second read
    would load it again, and loading a pickle runs its code."""
    if counted == 0:
        short = _Uncounted(frames[2:], True, safe, 0, MAX_SAME_HASH)
        try:
            return short.unpack(header), short.used.count(False)
        except _NeedsCounting:
            pass
        except ValueError as exc:
            if type(exc) is not ValueError:  # (msgpack's own subclasses: malformed)
                raise
    dec = Decoder(frames[2:], True, safe, -1)  # -1: counted, whatever its length
    return dec.unpack(header), dec.used.count(False)


def _wide(data: bytes) -> Any:
    """A short header (fewer than ``_COUNT_BELOW`` bytes, no buffers) with a map longer than
    ``MAX_SAME_HASH``, read by msgpack alone as a job over more ranks than that needs (its
    values' and stats' maps hold a key per rank); ``_NOT_READ`` if a long map has a key
    that is not an int, which the Decoder then reads and counts (check_spread).

    msgpack hands each map's pairs to ``_int_keyed`` before the map is built, so a
    long map is built only when its keys are all ints (64-bit, msgpack's own): those
    share a hash value 13 times at most, so no such map can flood one hash, however long
    (floats, short tuples and strs would need counting). ``_NOT_READ`` too for anything
    else msgpack refuses: the Decoder reads the header the general way and says why."""
    try:
        return msgpack.unpackb(
            data,
            ext_hook=_short_tuple,
            object_pairs_hook=_int_keyed,
            strict_map_key=False,
            raw=False,
            max_array_len=MAX_HEADER_ITEMS,
            # a pair takes 2 bytes at least: no longer map fits a short header, and msgpack
            # allocates no more room than this before the pairs arrive
            max_map_len=_COUNT_BELOW // 2,
        )
    except Exception:  # _NeedsDecoder, an extension only the Decoder reads, or malformed
        return _NOT_READ


def _int_keyed(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """The map of ``pairs`` for :func:`_wide`, built only if it holds at most
    ``MAX_SAME_HASH`` keys or its keys are all exact ints (no flood of one hash)."""
    if len(pairs) > MAX_SAME_HASH:
        for key, _ in pairs:
            if type(key) is not int:
                raise _NeedsDecoder
    return dict(pairs)


class _NeedsCounting(Exception):
    """A pickle met by the uncounted read, unloaded: the header goes to a counting Decoder."""


class _Uncounted(Decoder):
    """The uncounted read of :func:`_decoded`, which may be read again: it loads no pickle
    (in safe mode one is refused, unloaded, as by any Decoder)."""

    __slots__ = ()

    def _pickle(self, spec: Any) -> Any:
        if not self.safe:
            raise _NeedsCounting
        return super()._pickle(spec)


def _fields_of(rec: Record) -> list[Any]:
    if type(rec) is not JobResult:  # the prefix says it is one: decode built something else?
        raise ProtocolError("the answer is not the JobResult its header starts as")
    return [
        JobResult.TAG,
        rec.job,
        rec.values,
        rec.error,
        rec.missing_program,
        rec.stats,
        rec.metas,
    ]


class _NeedsDecoder(Exception):
    """An extension only the Decoder reads: the header goes to it."""


_NOT_READ = object()


def _short_tuple(code: int, data: bytes) -> Any:
    """The Decoder's read of a short tuple of small non-negative ints (its first branch for
    ``TUPLE``, at the top level, not counting containers), for a header msgpack reads alone;
    any other extension raises :class:`_NeedsDecoder`."""
    if code == TUPLE:
        n = len(data) - 1
        if 0 <= n < 16 and data[0] == 0x90 | n and (n == 0 or max(data[1:]) < 0x80):
            return tuple(data[1:])
    raise _NeedsDecoder


def _counted_length(view: memoryview) -> int:
    """The header length the Decoder bounds its work by: 0 (no hook per list and dict) for a
    short header with fewer list and map markers than ``MAX_NESTING``.

    Every list and dict the header builds, extension payloads included (they are slices of
    the header), starts with one marker byte. Counting every such byte over-counts (the same
    bytes occur inside strings and floats) but never under-counts, and fewer than
    ``MAX_NESTING`` containers can neither nest too deep nor build more than
    ``MAX_CONTAINERS``: the hooks would check nothing. A JobResult's header carries every
    rank's stats blob, so it is rarely shorter than ``MAX_NESTING`` bytes (the Decoder's own
    test), while its markers are few (the blobs' bytes may hold some: an over-count).
    """
    n = view.nbytes
    if n >= _COUNT_BELOW:
        return n
    data = view.tobytes()
    return 0 if n - len(data.translate(None, _CONTAINER_MARKERS)) < MAX_NESTING else n


def _fits_plain(values: Any, missing: Any, stats: Any, metas: Any) -> bool:
    """:func:`_fits` for fields msgpack alone read: no range checks (msgpack's ints are all
    64-bit) and exact types (msgpack builds exact dicts, lists and strs). Loops over keys
    and lookups: cheaper than loops over items, and than ``set(map(type, ...))`` on the
    handful of keys a result has (callgrind)."""
    if not (
        type(values) is dict
        and type(stats) is dict
        and type(metas) is dict
        and type(missing) is bool
    ):
        return False
    for index in values:  # dict[int, dict[int, Any]]
        by_rank = values[index]
        if type(index) is not int or type(by_rank) is not dict:
            return False
        for rank in by_rank:
            if type(rank) is not int:
                return False
    # dict[int, bytes]: each rank's blob, read on demand (run_stats); none is longer than
    # MAX_STATS_BYTES here (the header is shorter than _COUNT_BELOW: _fits checks longer)
    for rank in stats:
        if type(rank) is not int or type(stats[rank]) is not bytes:
            return False
    for index in metas:  # dict[int, str]  # noqa: SIM110 (all() and a generator: calls)
        if type(index) is not int or type(metas[index]) is not str:
            return False
    return True


def _fits(items: Any) -> bool:
    """The checks ``decode`` makes on a JobResult's fields (its annotations), written out
    as loops: a result has a handful of ranks, and a function call per key cost more."""
    if type(items) is not list or len(items) != 7:
        return False
    _, job, values, error, missing, stats, metas = items
    if not (
        isinstance(job, str)
        and isinstance(values, dict)
        and (error is None or isinstance(error, ErrorInfo))
        and type(missing) is bool
        and isinstance(stats, dict)
        and isinstance(metas, dict)
    ):
        return False
    for rank, by_output in values.items():  # dict[int, dict[int, Any]]
        if not (type(rank) is int and INT_MIN <= rank <= INT_MAX and isinstance(by_output, dict)):
            return False
        for index in by_output:
            if not (type(index) is int and INT_MIN <= index <= INT_MAX):
                return False
    for rank, stat in stats.items():  # dict[int, bytes], each within what a worker sends
        if not (
            type(rank) is int
            and INT_MIN <= rank <= INT_MAX
            and isinstance(stat, bytes)
            and len(stat) <= MAX_STATS_BYTES
        ):
            return False
    for index, meta in metas.items():  # dict[int, str]
        if not (type(index) is int and INT_MIN <= index <= INT_MAX and isinstance(meta, str)):
            return False
    return True


def refused_answer_job(frames: Sequence[Any]) -> str | None:
    """The job id a message :func:`read_answer` refused names, if its header starts as a
    ``JobResult``'s (this version's magic, the tag, then the id as a short str); nothing
    else of it is read. The driver fails that job at once (its answer came and cannot be
    accepted: stats over ``MAX_STATS_BYTES``, say) rather than wait out its deadline."""
    if len(frames) < 2 or bytes(frames[0]) != MAGIC_FRAME:
        return None
    head = memoryview(frames[1])[: len(_PREFIX) + 257]  # the tag, a str8 marker, its length
    at = len(_PREFIX)
    if head[:at] != _PREFIX or len(head) <= at:
        return None
    marker = head[at]
    if 0xA0 <= marker <= 0xBF:  # fixstr
        start, size = at + 1, marker & 0x1F
    elif marker == 0xD9 and len(head) > at + 1:  # str 8
        start, size = at + 2, head[at + 1]
    else:
        return None
    if len(head) < start + size:
        return None
    try:
        return bytes(head[start : start + size]).decode("ascii")
    except UnicodeDecodeError:
        return None
