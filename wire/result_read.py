"""The driver's decoder for what the broker answers: ``JobResult`` on a lean path.

Every job ends with one ``JobResult``, so the driver decodes one per job. The general
:func:`mpl.wire.codec.decode` checks its six fields with predicates compiled from their
annotations (about half of the decode's time); here the same checks are written out for this
one record. Everything else is as in ``decode``: the same frame, magic and size limits, the
same :class:`~mpl.wire.decoder.Decoder` (safe mode refuses pickles, buffer indexes checked,
nesting and container counts bounded), and every buffer frame must be referenced. The
message comes from the broker, which packs the workers' values into it: nothing in it is
trusted. Any other message goes to ``decode``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import repeat
from typing import Any

from mpl.wire.codec import MAGIC_FRAME, decode
from mpl.wire.decoder import Decoder
from mpl.wire.errors import ProtocolError
from mpl.wire.jobs import JobResult
from mpl.wire.limits import MAX_FRAMES, MAX_HEADER_BYTES, int_fits
from mpl.wire.record import Record
from mpl.wire.remote import ErrorInfo

__all__ = ["read_answer"]

_FIELDS = ("job", "values", "error", "missing_program", "stats", "metas")
# Written out by hand above and in _fits: a changed JobResult would otherwise fall back to
# decode on every answer, silently.
if tuple(f.name for f in dataclasses.fields(JobResult)) != _FIELDS:
    raise ImportError("mpl.wire.result_read: JobResult's fields changed; update this reader")
# a fixarray of the tag and six fields, then the tag as a fixstr
_PREFIX = b"\x97" + bytes([0xA0 | len(JobResult.TAG)]) + JobResult.TAG.encode()


def read_answer(frames: Sequence[Any], *, safe: bool) -> Record:
    """``decode(frames, safe=safe)``, faster for a ``JobResult``; raises ProtocolError for
    anything malformed, as ``decode`` does."""
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
    dec = Decoder(frames[2:], True, safe, view.nbytes)
    try:
        items = dec.unpack(header)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack and numpy errors mean "malformed", as in decode
        raise ProtocolError(f"malformed header: {type(exc).__name__}: {exc}") from exc
    if not _fits(items):
        raise ProtocolError(f"record {JobResult.TAG!r}: a field does not match its annotation")
    if not all(dec.used):
        raise ProtocolError(f"{dec.used.count(False)} buffer frame(s) not referenced by the header")
    rec = object.__new__(JobResult)
    rec.__dict__.update(zip(_FIELDS, items[1:], strict=True))
    return rec


def _fits(items: Any) -> bool:
    """The checks ``decode`` makes on a JobResult's fields (its annotations), written out."""
    if type(items) is not list or len(items) != 7:
        return False
    _, job, values, error, missing, stats, metas = items
    return (
        isinstance(job, str)
        and _int_keyed(values, _int_keyed_map)
        and (error is None or isinstance(error, ErrorInfo))
        and type(missing) is bool
        and _int_keyed(stats, _str_keyed_map)
        and _int_keyed(metas, _is_str)
    )


def _int_keyed(obj: Any, check: Any) -> bool:
    return isinstance(obj, dict) and all(map(int_fits, obj)) and all(map(check, obj.values()))


def _int_keyed_map(obj: Any) -> bool:
    return isinstance(obj, dict) and all(map(int_fits, obj))


def _str_keyed_map(obj: Any) -> bool:
    return isinstance(obj, dict) and all(map(isinstance, obj, repeat(str)))  # no Python frames


def _is_str(obj: Any) -> bool:
    return isinstance(obj, str)
