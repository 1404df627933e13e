"""A quick program's run on the I/O thread, compiled once from its plan.

A program that runs inline (``jobs.py``: purely local, quick last time) runs again and
again with the same ops. :func:`~mpl.worker.interpreter.run_graph` works each op out per
run: the kernel by opcode, the call's templates, the job's context, a clock read at each
op's start and end. :class:`InlineRun` works that out once per program: each op this rank
takes part in becomes the function it calls and how (no arguments, the op's inputs, or a
constant), and the run reads the clock once at the start and once per op after it (an op
starts when the one before ended). Spans, outputs and errors are those ``run_graph``
gives: ``tests/test_inline_run.py`` runs both on the same graphs.

Only plans made of plain calls compile: a ``pcall`` of a function (not a named kernel)
whose templates are empty or absent, and ``constant``. Any other op (a template to fill, a
``getitem``, a ``converge``) leaves the program to ``run_graph``.

A run that is still going when a progress report is due (an op starts
:data:`~mpl.wire.progress.FIRST_AFTER_S` after the run did) hands the op's position to
``report`` (which says when the next is due), as ``run_graph`` does through the job's
context.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

from mpl.wire.errors import JobAbortedError
from mpl.wire.kernels import KernelRef
from mpl.worker.interpreter import ABSENT, MAX_SPANS, OpFailed, Plan, split_outputs

__all__ = ["InlineRun"]

# how each compiled op gets its value(s)
_NO_ARGS, _WITH_INPUTS, _CONSTANT = 0, 1, 2
# a report of where the job is: (ops of this rank done, the op's index, now) -> when the
# next one is due
Report = Callable[[int, int, float], float]


class InlineRun:
    """A plan compiled for inline runs: :meth:`compile` it, then :meth:`run` it."""

    __slots__ = ("call", "only", "outputs", "plan", "single", "steps")

    def __init__(self, plan: Plan, steps: tuple[tuple[Any, ...], ...]) -> None:
        self.plan = plan
        self.outputs = plan.graph.outputs
        self.single = len(self.outputs) == 1  # one output (most): no map over them
        # per op: (index, whether this rank takes part, how, function or value, inputs,
        # first output's id, outputs, values to drop after it, label)
        self.steps = steps
        # the op index and label of the one op this rank takes part in (most programs: one
        # pcall), whose span is then a run's only one; None for any other number of ops
        here = [(step[0], step[8]) for step in steps if step[1]]
        self.only: tuple[int, str] | None = here[0] if len(here) == 1 else None
        # that one op's function when it takes no arguments and its one value is the
        # program's one output (most: a pcall of a function returning one value); else
        # None. The job shell then makes the call itself: the run is that call, its span
        # (op, label, 0.0, its seconds) and its output that value (ABSENT stays ABSENT),
        # and a failure of it is OpFailed(label, exc) as run raises it
        self.call: Callable[[], Any] | None = None
        if self.only is not None and self.single:
            _, _, how, what, _, vid, nout, frees, _ = next(step for step in steps if step[1])
            if how == _NO_ARGS and nout == 1 and self.outputs[0] == vid and vid not in frees:
                self.call = what

    @classmethod
    def compile(cls, plan: Plan) -> InlineRun | None:
        """The plan's compiled run, or None if an op this rank takes part in is no plain
        call (see the module docstring)."""
        graph = plan.graph
        steps = []
        for k, op, here, vid, frees, label in plan.steps:
            how: int = _NO_ARGS
            what: Any = None
            if here:
                attrs = op.attrs
                if op.opcode == "constant":
                    how, what = _CONSTANT, attrs["value"]
                elif op.opcode != "pcall":
                    return None
                else:
                    what = graph.fns[attrs["fn"]]
                    if isinstance(what, KernelRef):
                        return None
                    if "args" in attrs or "kwargs" in attrs:
                        if attrs.get("args", ()) or attrs.get("kwargs", {}):
                            return None  # a template to fill: run_graph's
                    else:
                        how = _WITH_INPUTS
            steps.append((k, here, how, what, op.inputs, vid, op.nout, frees, label))
        return cls(plan, tuple(steps))

    def run(
        self, inputs: Sequence[Any], started: float, report_at: float, report: Report
    ) -> tuple[list[Any], list[list[Any]], float]:
        """Run the plan from ``inputs`` (ABSENT where not held), the run having started at
        ``started`` (``time.monotonic()``): its outputs (ABSENT where not held), its op
        spans and when its last op ended. Raises as ``run_graph`` does (``OpFailed``)."""
        env: dict[int, Any] = {}
        if inputs:
            env = {i: v for i, v in enumerate(inputs) if v is not ABSENT}
        spans: list[list[Any]] = []
        start = started
        done = 0
        for k, here, how, what, ins, vid, nout, frees, label in self.steps:
            if here:
                if start >= report_at:  # short runs report nothing
                    report_at = report(done, k, start)
                done += 1
                try:
                    if how == _NO_ARGS:
                        result = what()
                    elif how == _WITH_INPUTS:
                        result = what(*map(env.get, ins, repeat(ABSENT)))
                    else:
                        result = what
                    if nout == 1:
                        if result is not ABSENT:
                            env[vid] = result
                    else:
                        for i, value in enumerate(split_outputs(result, nout)):
                            if value is not ABSENT:
                                env[vid + i] = value
                except (JobAbortedError, OpFailed):
                    raise
                except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt too
                    raise OpFailed(label, exc) from exc
                end = time.monotonic()
                if done <= MAX_SPANS:  # a span per op run so far: len(spans) < MAX_SPANS
                    spans.append([k, label, start - started, end - started])
                start = end
            for v in frees:
                env.pop(v, None)
        if self.single:
            return [env.get(self.outputs[0], ABSENT)], spans, start
        return list(map(env.get, self.outputs, repeat(ABSENT))), spans, start
