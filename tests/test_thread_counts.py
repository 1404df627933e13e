"""The counts over all threads that let the hot paths skip the thread-locals
(``context.ENTERED``, ``recorder.TRACING``): each thread still sees its own contexts and
traces, whatever another thread does, and the counts return to zero."""

from __future__ import annotations

import threading
from typing import Any

import mpl.driver as mp
from mpl.driver import recorder
from mpl.driver.context import ENTERED, current
from mpl.driver.recorder import TRACING


def test_each_thread_sees_its_own_entered_context_and_the_default_otherwise() -> None:
    first, second = mp.Simulator.simple(2), mp.Simulator.simple(2)
    try:
        with first, second:
            assert ENTERED[0] == 2
    finally:
        first.close()
        second.close()
    assert ENTERED[0] == 0
    a, b = mp.Simulator.simple(2), mp.Simulator.simple(2)
    try:
        mp.set_context(a)
        inside, release = threading.Event(), threading.Event()
        seen: list[Any] = []

        def in_b() -> None:
            with b:
                seen.append(current())
                inside.set()
                release.wait(30)
            seen.append(current())

        thread = threading.Thread(target=in_b)
        thread.start()
        assert inside.wait(30)
        assert ENTERED[0] == 1 and current() is a  # the other thread's with: not this one's
        one = mp.function(lambda: mp.simp.pcall((0,), lambda: 1))
        assert mp.fetch(one()) == 1 and a.jobs and not b.jobs  # ran in a
        release.set()
        thread.join(30)
        assert seen == [b, a] and ENTERED[0] == 0
        b.__exit__(None, None, None)  # an exit without its enter: nothing to uncount
        assert ENTERED[0] == 0
    finally:
        mp.set_context(None)
        a.close()
        b.close()


def test_a_trace_counts_while_it_runs_and_a_function_called_in_it_is_inlined() -> None:
    seen: list[int] = []
    inner = mp.function(lambda: mp.simp.pcall((0, 1), lambda: 2))

    def outer() -> Any:
        seen.append(TRACING[0])
        return inner()  # inlined into outer's trace: one job

    sim = mp.Simulator.simple(2)
    try:
        with sim:
            assert mp.fetch(mp.function(outer)()) == [2, 2]
            assert len(sim.jobs) == 1
    finally:
        sim.close()
    assert seen == [1] and TRACING[0] == 0 and recorder.active() is None
