"""Tagged records: the dataclasses that cross the wire.

A record is a dataclass that subclasses :class:`Record` with a ``tag``::

    @dataclass(eq=False, repr=False)
    class Heartbeat(Record, tag="hb"):
        sent_at: float

:class:`Record` itself supplies equality, ``repr`` and immutability (a field cannot be
reassigned once set), so the dataclass only generates ``__init__``: defining a frozen
dataclass costs several times more, and daemons import dozens of records at start-up.

On the wire it is the msgpack array ``[tag, field0, field1, ...]`` in declaration order
(see ``mpl.wire.codec``). Decoding looks the tag up in one registry and checks every field
against its annotation, so a peer cannot hand us a ``str`` where an ``int`` belongs.
Supported annotations: ``Any``/``object``, ``int``, ``float``, ``bool``, ``str``, ``bytes``,
``None``, unions, ``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[K, V]``, ``Literal``,
``numpy.ndarray`` and other records. ``int`` fields hold 64-bit integers (``BigInt`` fields,
from ``mpl.wire.limits``, any size); ``bool`` is never accepted as an int.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from mpl.wire.errors import ProtocolError
from mpl.wire.limits import BIG, int_fits

__all__ = [
    "Record",
    "built",
    "pinned_fields",
    "record_class",
    "record_fields",
    "record_from_fields",
    "replaced",
]

R = TypeVar("R", bound="Record")
_Check = Callable[[Any], bool]


class Record:
    """Base of every wire record. Subclass with ``tag="..."`` and ``@dataclass(eq=False,
    repr=False)``; records compare by type and fields and cannot be modified."""

    TAG: ClassVar[str] = ""
    # True on records whose digest decoding computes from their bytes (the graph); declared
    # here so that every decode finds it on the class, a miss costs a failed lookup
    WIRE_DIGEST: ClassVar[bool] = False
    _registry: ClassVar[dict[str, type[Record]]] = {}
    __hash__ = None  # type: ignore[assignment]  # fields are often dicts or lists

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return record_fields(self) == record_fields(other)

    def __repr__(self) -> str:
        names = _spec(type(self)).names
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    def __init_subclass__(cls, *, tag: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not tag:
            return
        if tag in Record._registry:
            raise TypeError(f"record tag {tag!r} is used twice")
        cls.TAG = tag
        Record._registry[tag] = cls


def record_class(tag: str) -> type[Record] | None:
    """The record class registered under ``tag``, or None."""
    return Record._registry.get(tag)


class _Spec:
    """What decoding needs to know about one record class, built once per class."""

    __slots__ = ("checks", "direct", "names")

    def __init__(self, cls: type[Any]) -> None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} must be a dataclass")
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = dataclasses.fields(cls)
        self.names: tuple[str, ...] = tuple(f.name for f in fields)
        # Decoded values are checked here, so a record can be filled in directly, without
        # the generated __init__ and a guarded __setattr__ per field, unless the class does
        # more on construction than storing its fields. Filled from a dict (or keywords):
        # a __dict__ filled from a zip, or key by key, reads each field about twice as slow
        # ever after (CPython 3.11's attribute cache misses on such a dict).
        self.direct = not hasattr(cls, "__post_init__") and all(f.init for f in fields)
        # per field: (position, name, check, hint); fields that accept anything need no check
        self.checks: tuple[tuple[int, str, _Check, Any], ...] = tuple(
            (i, f.name, check, hints[f.name])
            for i, f in enumerate(fields)
            if (check := _checker(hints[f.name])) is not None
        )


_SPECS: dict[type[Record], _Spec] = {}


def _spec(cls: type[Record]) -> _Spec:
    spec = _SPECS.get(cls)
    if spec is None:
        if not dataclasses.is_dataclass(cls):
            # A class registers its tag as its body ends, before @dataclass finishes it: if
            # another thread is importing its module right now (a job thread loading SPU
            # shares while a share arrives), wait for that import rather than refuse.
            importlib.import_module(cls.__module__)
        spec = _SPECS[cls] = _Spec(cls)
    return spec


def record_fields(rec: Record) -> list[Any]:
    """The field values of ``rec`` in declaration order."""
    return [getattr(rec, name) for name in _spec(type(rec)).names]


def record_from_fields(cls: type[R], values: Sequence[Any]) -> R:
    """Build ``cls`` from decoded field values, checking each against its annotation."""
    spec = _spec(cls)
    if len(values) != len(spec.names):
        raise ProtocolError(f"record {cls.TAG!r} needs {len(spec.names)} fields, got {len(values)}")
    for i, name, check, hint in spec.checks:
        value = values[i]
        if not check(value):
            raise ProtocolError(
                f"record {cls.TAG!r} field {name!r}: expected {_show(hint)}, "
                f"got {type(value).__name__}"
            )
    if not spec.direct:
        return cls(*values)
    rec = object.__new__(cls)
    # counted above (strict=True would cost more than the fill); why a dict: _Spec
    rec.__dict__.update(dict(zip(spec.names, values, strict=False)))
    return rec


def built(cls: type[R], *values: Any) -> R:
    """``cls(*values)`` (every field, in order) without ``__init__`` or checks.

    Only for a record a process builds on its hot path from values it decoded (so checked)
    or made itself: the broker's ``JobResult`` from its ranks' ``Done`` values. Raises
    TypeError when the count of values is not the count of fields.
    """
    spec = _spec(cls)
    if len(values) != len(spec.names):
        raise TypeError(f"{cls.__name__} has {len(spec.names)} fields, got {len(values)}")
    if not spec.direct:
        return cls(*values)
    rec = object.__new__(cls)
    # counted above (strict=True would cost more than the fill); why a dict: _Spec
    rec.__dict__.update(dict(zip(spec.names, values, strict=False)))
    return rec


def pinned_fields(
    cls: type[Record], expected: tuple[str, ...], user: str, *, direct: bool = False
) -> tuple[str, ...]:
    """``expected``, the field names of ``cls`` as a hot path in ``user`` writes them out by
    hand (to pack, read or fill in a record without the general codec), checked once when
    ``user`` is imported: ImportError if the fields changed (``user`` must be updated, or
    every message would be packed or read wrong), or, with ``direct``, if ``cls`` does more
    on construction than store its fields (``user`` makes its records as
    ``object.__new__(cls)`` with the ``__dict__`` filled in, what :func:`built` does)."""
    spec = _spec(cls)
    if spec.names != expected:
        raise ImportError(f"{user}: {cls.__name__}'s fields changed; update it")
    if direct and not spec.direct:
        raise ImportError(f"{user}: {cls.__name__} does more on construction; use built")
    return expected


def replaced(rec: R, **changes: Any) -> R:
    """A copy of ``rec`` with some fields changed, built without ``__init__`` or checks.

    Only for a record this process derives from one it decoded (so checked) or built
    itself, with values taken from it (the broker's per-rank ``Exec``: the driver's, with
    one rank's bindings): nothing here is checked again. Raises TypeError for a name that
    is not a field.
    """
    cls = type(rec)
    spec = _spec(cls)
    unknown = changes.keys() - set(spec.names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    if not spec.direct:
        return cls(**{**{n: rec.__dict__[n] for n in spec.names}, **changes})
    copy = object.__new__(cls)
    fields = rec.__dict__
    if len(fields) != len(spec.names):  # values cached from the fields: never copied
        fields = {n: fields[n] for n in spec.names}
    copy.__dict__.update(fields)
    copy.__dict__.update(changes)
    return copy


def _show(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _checker(hint: Any) -> _Check | None:
    """Compile an annotation into a fast predicate; None when any value is accepted.

    Containers of anything check only the container (and their keys), not every item.
    """
    if hint is Any or hint is object:
        return None
    if hint is None or hint is type(None):
        return lambda v: v is None
    if hint is bool:
        return lambda v: type(v) is bool
    if hint is int:  # 64 bits (mpl.wire.limits): a huge int breaks whoever formats it
        return int_fits
    if hint is float:
        return lambda v: type(v) is float or int_fits(v)
    if hint is str:
        return lambda v: type(v) is str or isinstance(v, str)
    if isinstance(hint, type):
        return lambda v: isinstance(v, hint)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:  # BigInt: an int field declared to exceed 64 bits
        if args[0] is int and BIG in hint.__metadata__:
            return lambda v: type(v) is int
        return _checker(args[0])
    if origin in (typing.Union, types.UnionType):
        checks = [_checker(a) for a in args]
        if any(c is None for c in checks):
            return None
        parts = tuple(c for c in checks if c is not None)
        return lambda v: any(p(v) for p in parts)
    if origin is typing.Literal:
        allowed = frozenset(args)
        return lambda v: isinstance(v, (str, int)) and v in allowed
    if origin is list:
        item = _checker(args[0]) if args else None
        if item is None:
            return lambda v: isinstance(v, list)
        return lambda v: isinstance(v, list) and all(map(item, v))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            each = _checker(args[0])
            if each is None:
                return lambda v: isinstance(v, tuple)
            return lambda v: isinstance(v, tuple) and all(map(each, v))
        items = tuple(_checker(a) or _anything for a in args)
        return lambda v: (
            isinstance(v, tuple)
            and len(v) == len(items)
            and all(c(x) for c, x in zip(items, v, strict=True))
        )
    if origin is dict:
        key, val = (_checker(args[0]), _checker(args[1])) if args else (None, None)
        if key is None and val is None:
            return lambda v: isinstance(v, dict)
        if val is None:
            assert key is not None
            return lambda v: isinstance(v, dict) and all(map(key, v))
        if key is None:
            return lambda v: isinstance(v, dict) and all(map(val, v.values()))
        return lambda v: isinstance(v, dict) and all(map(key, v)) and all(map(val, v.values()))
    raise TypeError(f"unsupported record annotation {hint!r}")


def _anything(v: Any) -> bool:
    return True
