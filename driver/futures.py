"""``mp.submit``, ``mp.wait`` and ``mp.as_completed``: many jobs in flight from one thread.

``mp.submit(fn_or_program, *args)`` traces like ``@mp.function`` (or takes a compiled
``mp.Program``), starts the job and returns a ``concurrent.futures.Future`` at once. Its
result is exactly what calling the function returns (Values, in the same structure); the
job's error is raised by ``.result()``. Every future settles by itself: at the latest at the
job's deadline, or when its context closes. So ``mp.wait`` and ``mp.as_completed``, which are
``concurrent.futures.wait`` and ``as_completed`` over these futures, end even without a
``timeout``.

    futures = [mp.submit(step, x, i) for i in range(64)]   # all 64 in flight
    for f in mp.as_completed(futures):
        print(mp.fetch(f.result()))
"""

from __future__ import annotations

import concurrent.futures as _cf
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any

from mpl.driver.context import current
from mpl.driver.job_future import interrupted
from mpl.driver.programs import Function, Program
from mpl.driver.recorder import active
from mpl.wire.errors import MplError

__all__ = ["ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION", "as_completed", "submit", "wait"]

ALL_COMPLETED = _cf.ALL_COMPLETED
FIRST_COMPLETED = _cf.FIRST_COMPLETED
FIRST_EXCEPTION = _cf.FIRST_EXCEPTION

# Plain functions given to submit keep their traces between calls (as @mp.function would),
# for as long as the function itself lives.
_functions: weakref.WeakKeyDictionary[Callable[..., Any], Function] = weakref.WeakKeyDictionary()


def submit(fn_or_program: Callable[..., Any] | Program, *args: Any, **kwargs: Any) -> Future[Any]:
    """Start ``fn_or_program(*args, **kwargs)`` as one job; return its future at once.

    ``fn_or_program`` is an ``@mp.function``, an ``mp.Program`` from ``mp.compile``, or any
    function that ``@mp.function`` could trace. The future's result is what the call
    returns; ``.result()`` raises the job's error (``RemoteError``, ``MplTimeoutError`` at the
    job's deadline, ``MplError`` if the context closes first). Input Values stay alive until
    the job has run, so dropping them after submitting is safe.
    """
    if active() is not None:
        raise MplError("mp.submit cannot be used inside @mp.function; call the function instead")
    ctx = current()
    if type(fn_or_program) is Function or isinstance(fn_or_program, Program):
        return fn_or_program.submit(ctx, args, kwargs)
    return _function(fn_or_program).submit(ctx, args, kwargs)


def _function(fn: Callable[..., Any]) -> Function:
    if isinstance(fn, Function):
        return fn
    if not callable(fn):
        raise TypeError(f"mp.submit takes a function or an mp.Program, got {type(fn).__name__}")
    try:
        func = _functions.get(fn)
    except TypeError:  # not weakly referenceable: trace afresh each time
        return Function(fn)
    if func is None:
        func = _functions[fn] = Function(fn)
    return func


def wait(
    futures: Iterable[Future[Any]],
    timeout: float | None = None,
    return_when: str = ALL_COMPLETED,
) -> tuple[set[Future[Any]], set[Future[Any]]]:
    """``concurrent.futures.wait``: the (done, not_done) sets once ``return_when`` holds."""
    waited = list(futures)
    try:
        done, not_done = _cf.wait(waited, timeout=timeout, return_when=return_when)
    except KeyboardInterrupt:  # Ctrl-C: the jobs waited for stop too
        interrupted(waited)
        raise
    return set(done), set(not_done)


def as_completed(
    futures: Iterable[Future[Any]], timeout: float | None = None
) -> Iterator[Future[Any]]:
    """``concurrent.futures.as_completed``: each future as it settles."""
    waited = list(futures)
    try:
        yield from _cf.as_completed(waited, timeout=timeout)
    except KeyboardInterrupt:  # Ctrl-C while it waits: the jobs not settled yet stop too
        interrupted(waited)
        raise
