"""``mp.simp``: the party-level API. Values here are placed on sets of ranks, not devices.

* ``pcall(parties, fn, *args, nout=1)`` runs ``fn`` on each of ``parties`` with its local data;
* ``shuffle(x, {dst: src, ...})`` moves data, receiver-oriented (one source may feed many);
* ``converge(*xs)`` joins values held by disjoint ranks into one;
* ``constant(parties, value)`` places a host value on ``parties``.

Misuse is caught while recording: ``TypeError`` for a wrong kind of argument, ``ValueError``
(a ``GraphError``) for a placement rule broken, e.g. a pcall on ranks its inputs do not cover.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpl.driver.recorder import Recorder, call_template, emit
from mpl.driver.tree import flatten_call
from mpl.driver.values import Value

__all__ = ["constant", "converge", "pcall", "shuffle"]


def _parties(parties: Any) -> tuple[int, ...]:
    if isinstance(parties, int):
        parties = (parties,)
    if not isinstance(parties, (list, tuple, set, frozenset)) or not parties:
        raise ValueError(f"parties must be a non-empty collection of ranks, got {parties!r}")
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in parties):
        raise TypeError(f"parties must be ints, got {parties!r}")
    return tuple(sorted(set(parties)))


def pcall(
    parties: Sequence[int], fn: Callable[..., Any], *args: Any, nout: int = 1, **kwargs: Any
) -> Any:
    """Run ``fn`` on every rank of ``parties``; returns a Value (or a tuple of ``nout``)."""
    ranks = _parties(parties)
    if not callable(fn):
        raise TypeError(f"pcall needs a callable, got {type(fn).__name__}")
    leaves, treedef = flatten_call(args, kwargs)

    def build(rec: Recorder) -> list[tuple[int, str | None]]:
        inputs, targs, tkwargs = call_template(
            leaves, treedef, rec.of, lambda x: rec.host(x, ranks)
        )
        outs = rec.op(
            "pcall",
            inputs,
            ranks=ranks,
            nout=nout,
            fn=rec.fn(fn),
            args=targs,
            kwargs=tkwargs,
            name=str(getattr(fn, "__qualname__", "fn")),
        )
        return [(o, None) for o in outs]

    values = emit(build, name="pcall")
    return values[0] if nout == 1 else tuple(values)


def shuffle(x: Value, routing: dict[int, int]) -> Value:
    """Move ``x`` so that each ``dst`` receives the value its ``src`` holds."""
    if not isinstance(x, Value):
        raise TypeError(f"shuffle moves a Value, got {type(x).__name__}")
    if not isinstance(routing, dict):
        raise TypeError(f"routing must be a dict {{dst: src}}, got {type(routing).__name__}")
    if not routing:
        raise ValueError("routing must not be empty")
    ranks = sorted({*routing, *routing.values()})
    return emit(
        lambda rec: [(rec.op("shuffle", [rec.of(x)], ranks=ranks, routing=dict(routing))[0], None)],
        name="shuffle",
    )[0]


def converge(*xs: Value) -> Value:
    """Join values held by disjoint sets of ranks into one held by their union."""
    if not xs:
        raise ValueError("converge needs at least one value")
    for x in xs:
        if not isinstance(x, Value):
            raise TypeError(f"converge joins Values, got {type(x).__name__}")
    ranks = sorted({r for x in xs for r in x.parties})
    return emit(
        lambda rec: [(rec.op("converge", [rec.of(x) for x in xs], ranks=ranks)[0], None)],
        name="converge",
    )[0]


def constant(parties: Sequence[int], value: Any) -> Value:
    """Place the host ``value`` on every rank of ``parties``."""
    ranks = _parties(parties)
    if isinstance(value, Value):
        raise TypeError("constant places host data; use shuffle to move a Value")
    return emit(lambda rec: [(rec.host(value, ranks), None)], name="constant")[0]
