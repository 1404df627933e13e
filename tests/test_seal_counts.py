"""What secure mode adds per trivial job, counted (never timed): cipher calls and Python calls
in the driver's and the worker's sealing. A job's rank without inputs gets a sealed None
(a tag, no cipher); its one result is the only payload either side runs the cipher on."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import zmq

from mpl.wire.jobs import Done, Exec
from mpl.wire.seal import Sealer, done_context, exec_context
from mpl.worker.sealing import WorkerSeal


def _pair() -> tuple[Sealer, Sealer]:
    keys = {n: zmq.curve_keypair() for n in ("driver:a", "node:n0")}
    public = {n: k[0].decode() for n, k in keys.items()}
    driver = Sealer(keys["driver:a"][1].decode(), "driver:a", {"node:n0": public["node:n0"]})
    node = Sealer(keys["node:n0"][1].decode(), "node:n0", {"driver:a": public["driver:a"]})
    return driver, node


class _Count:
    """Python calls and calls into the cipher made while it is on."""

    def __init__(self) -> None:
        self.calls = 0
        self.cipher: Counter[str] = Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
        elif event == "c_call":
            name = getattr(arg, "__qualname__", "")
            if name.startswith("ChaCha20Poly1305."):
                self.cipher[name] += 1

    def __enter__(self) -> _Count:
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


def _jobs(driver: Sealer, n: int) -> list[tuple[Exec, Done]]:
    """``n`` trivial jobs on rank 0 (no inputs, one inline result) as the worker gets them."""
    out = []
    for i in range(n):
        job = f"j{i}"
        context = exec_context("s", job, "d", (0,), (0,), 5.0)
        sealed = driver.seal(None, "node:n0", context, safe=False)
        out.append((Exec("s", job, "d", (0,), {0: sealed}, (0,), 5.0), Done("s", job, 0, {0: 1})))
    return out


def test_a_rank_without_inputs_costs_neither_side_a_cipher_call() -> None:
    driver, node = _pair()
    context = exec_context("s", "j", "d", (0,), (0,), 5.0)
    with _Count() as sealing:
        sealed = driver.seal(None, "node:n0", context, safe=False)
    with _Count() as opening:
        assert node.open(sealed, context, safe=False) == ("driver:a", None)
    with _Count() as again:  # its epoch now known to the node
        node.open(driver.seal(None, "node:n0", context, safe=False), context, safe=False)
    assert sealing.cipher == opening.cipher == again.cipher == Counter()


# main (68feee1) made 19.3 Python calls per job here (the None through the cipher and the
# scalar table, the bindings through a helper, the results through a comprehension)
_WORKER_CALLS = 16


def test_the_workers_sealing_per_trivial_job_one_cipher_call_and_bounded_python_calls() -> None:
    """Opening the job's sealed None and sealing its one result: the result's encryption is
    the only cipher call, and the Python calls stay within their bound."""
    driver, node = _pair()
    worker = WorkerSeal(node, 0)
    warm, jobs = _jobs(driver, 5), _jobs(driver, 20)
    for exec_, done in warm:
        worker.inbound(exec_)
        worker.outbound(done)
    sealed: list[Any] = []
    with _Count() as count:
        for exec_, done in jobs:
            opened, refused = worker.inbound(exec_)
            sealed.append(worker.outbound(done))
    assert refused is None and opened is not None
    for (exec_, _), out in zip(jobs, sealed, strict=True):
        assert type(out) is Done
        context = done_context("s", exec_.job, 0)
        assert driver.open(out.values[0], context, sender="node:n0") == ("node:n0", 1)
    assert "ChaCha20Poly1305.decrypt" not in count.cipher  # main opened every None with it
    assert count.cipher["ChaCha20Poly1305.encrypt"] <= 20
    per_job = count.calls / 20
    print(f"{per_job} Python calls per job in the worker's sealing")
    assert per_job <= _WORKER_CALLS
