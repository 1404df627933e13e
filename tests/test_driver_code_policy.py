"""A driver a node's own spec lists with ``code: kernels`` (review w30, finding 5): on a
``--code any`` worker its jobs, by their authenticated sealer, run only named kernels and
built-in ops, as every job does under ``--code kernels``; the other drivers' jobs run any
code, on the same short path as before. Written against the pure cores (``WorkerSeal``,
``driver_code_policy``, the spec)."""

from __future__ import annotations

import fractions
from pathlib import Path
from typing import Any

import pytest
from deployment import Deployment
from test_session_driver_binding import _job, _runs, _sealers

from mpl.wire import ClusterSpec, GraphBuilder
from mpl.wire.errors import ClusterSpecError
from mpl.wire.graph import Graph
from mpl.wire.jobs import Exec, Failed, Program
from mpl.wire.kernels import KernelRef
from mpl.wire.seal import Sealer, exec_context, program_context
from mpl.worker.code_policy import driver_code_policy
from mpl.worker.sealing import WorkerSeal

_KEYS = [  # 40 z85 characters each: a spec's keys (nothing is sealed with these)
    "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
    "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6",
    "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID",
    "Op9jC:9Nw]ZtHw9Sd^?aD.L(0Mlk+@RW%U/x?fh5",
]


def _spec(**codes: str) -> ClusterSpec:
    drivers = [{"name": "a", "curve_key": _KEYS[2]}, {"name": "b", "curve_key": _KEYS[3]}]
    for entry in drivers:
        if entry["name"] in codes:
            entry["code"] = codes[entry["name"]]
    return ClusterSpec.from_dict(
        {
            "broker": {"curve_key": _KEYS[0]},
            "nodes": [{"name": "n0", "curve_key": _KEYS[1]}],
            "devices": {"P0": {"kind": "PPU", "members": ["n0"]}},
            "drivers": drivers,
        }
    )


def test_a_driver_entry_says_its_code_and_round_trips() -> None:
    spec = _spec(b="kernels")
    assert [d.code for d in spec.drivers] == ["", "kernels"]
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    assert "code" not in spec.to_dict()["drivers"][0]  # absent: the worker's --code
    with pytest.raises(ClusterSpecError, match=r"drivers\[1\]\.code"):
        _spec(b="python")


def test_a_kernels_entry_binds_on_an_any_worker_and_an_any_entry_cannot_loosen_kernels() -> None:
    assert driver_code_policy(_spec(b="kernels"), "any") == {"driver:b"}
    assert driver_code_policy(_spec(a="any"), "any") == frozenset()
    assert driver_code_policy(_spec(b="kernels"), "kernels") == frozenset()  # all are
    assert driver_code_policy(None, "any") == frozenset()  # plaintext: no drivers
    with pytest.raises(ValueError, match="code: any"):
        driver_code_policy(_spec(a="any"), "kernels")


def _secret() -> int:
    return 918273645


def _walk() -> int:
    return 1  # stands for a function of a's that b's job must not run


def _graph(fn: Any) -> Graph:
    builder = GraphBuilder(1)
    (out,) = builder.op("pcall", [], ranks=(0,), fn=builder.fn(fn))
    return builder.build([out])


def _program(driver: Sealer, graph: Graph) -> Program:
    sealed = driver.seal_record(graph, "node:n0", program_context(graph.digest), safe=False)
    return Program(graph.digest, None, {0: sealed})


def _job_of(driver: Sealer, digest: str, bindings: Any = None) -> tuple[Exec, Any]:
    msg, _ = _job(driver, "s-" + driver.identity)
    context = exec_context(msg.session, msg.job, digest, (0,), (0,), 5.0)
    msg = Exec(msg.session, msg.job, digest, (0,), {}, (0,), 5.0)
    return msg, driver.seal(bindings, "node:n0", context, safe=False)


def _refused_for_code(answer: Any) -> bool:
    return (
        type(answer) is Failed
        and answer.error.remote_type == "PermissionError"
        and "code: kernels" in answer.error.message
    )


def test_a_kernels_drivers_code_is_refused_and_its_kernels_run() -> None:
    """b is listed ``code: kernels`` on this ``--code any`` worker: its program of code is
    dropped unloaded and its job naming it refused saying why; its inputs holding a pickle
    are refused; a's program of code (opened here in full) is refused to b's jobs too; b's
    program of named kernels runs, with safe inputs."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0, kernels_drivers=frozenset({"driver:b"}))
    b_code = _graph(_secret)
    opened, answer = worker.inbound(_program(b, b_code))
    assert opened is None and answer is None  # dropped, its function never loaded
    assert _refused_for_code(_runs(worker, _job_of(b, b_code.digest)))

    a_code = _graph(_walk)
    opened, _ = worker.inbound(_program(a, a_code))
    assert type(opened) is Program and opened.graph is not None
    assert opened.graph.fns[0] is _walk  # a's code, unpickled: a may ship code here
    assert _runs(worker, _job_of(a, a_code.digest)) is None  # a's job runs it
    assert _refused_for_code(_runs(worker, _job_of(b, a_code.digest)))  # b's may not

    kernels = _graph(KernelRef("mpl.io.read_npy"))
    opened, _ = worker.inbound(_program(b, kernels))
    assert type(opened) is Program and opened.graph is not None
    assert _runs(worker, _job_of(b, kernels.digest, ["x.npy"])) == ["x.npy"]
    assert _refused_for_code(_runs(worker, _job_of(b, kernels.digest, [fractions.Fraction(1)])))
    assert _runs(worker, _job_of(a, kernels.digest, [fractions.Fraction(1)])) == [
        fractions.Fraction(1)
    ]


def test_a_code_program_is_refused_to_a_kernels_driver_only_while_it_is_held() -> None:
    """The record of a's program of code lives with its graph (the worker's program
    cache holds it): a program no one holds any more names nothing runnable here."""
    a, _, node = _sealers()
    worker = WorkerSeal(node, 0, kernels_drivers=frozenset({"driver:b"}))
    code = _graph(_secret)
    opened, _ = worker.inbound(_program(a, code))
    assert code.digest in worker._kernels.code_programs
    del opened
    assert code.digest not in worker._kernels.code_programs  # (CPython: freed with its last holder)


def test_a_kernels_drivers_repeats_keep_to_the_full_path_and_others_take_the_short_one() -> None:
    """b's sealed Nones never teach ``open_exec`` their head (its short path would not
    check their program); a's do, as on a worker with no such entry."""
    a, b, node = _sealers()
    worker = WorkerSeal(node, 0, kernels_drivers=frozenset({"driver:b"}))
    for _ in range(3):
        assert _runs(worker, _job(b, "sb")) is None
    assert worker._heads == {}
    for _ in range(3):
        assert _runs(worker, _job(a, "sa")) is None
    assert {known[1] for known in worker._heads.values()} == {"driver:a"}


def test_without_kernels_entries_the_seal_opens_as_before() -> None:
    """No entry: the worker's seal opens programs and jobs in full, screens nothing."""
    a, _, node = _sealers()
    worker = WorkerSeal(node, 0)
    code = _graph(_secret)
    opened, _ = worker.inbound(_program(a, code))
    assert type(opened) is Program and opened.graph is not None
    assert opened.graph.fns[0] is _secret
    assert len(worker._kernels.code_programs) == 0
    assert _runs(worker, _job_of(a, code.digest, [fractions.Fraction(2)])) == [
        fractions.Fraction(2)
    ]


def test_a_program_under_another_programs_digest_refuses_no_one_elses_jobs() -> None:
    """b (kernels) seals a program of code under the digest of a program of kernels: it is
    dropped, but records nothing against that digest, whose own program b's jobs (and any
    kernels driver's) still run."""
    _, b, node = _sealers()
    worker = WorkerSeal(node, 0, kernels_drivers=frozenset({"driver:b"}))
    kernels = _graph(KernelRef("mpl.io.read_npy"))
    code = _graph(_secret)
    forged = b.seal_record(code, "node:n0", program_context(kernels.digest), safe=False)
    worker.inbound(Program(kernels.digest, None, {0: forged}))
    opened, _ = worker.inbound(_program(b, kernels))
    assert type(opened) is Program
    assert _runs(worker, _job_of(b, kernels.digest)) is None


@pytest.mark.daemons
def test_a_kernels_worker_does_not_start_with_a_driver_listed_code_any(tmp_path: Path) -> None:
    """``mpl-worker --code kernels`` binds every driver: an entry cannot loosen it, and a
    spec that tries says so at start rather than run a policy the operator did not mean."""
    d = Deployment(tmp_path)
    data = d.spec.to_dict()
    data["drivers"][0]["code"] = "any"
    own = tmp_path / "own.yaml"
    own.write_text(ClusterSpec.from_dict(data).to_yaml())
    d.address = "tcp://127.0.0.1:9"  # never dialled: the worker stops before
    try:
        proc = d.start_worker(0, extra=["--code", "kernels"], cluster=own)
        assert proc.wait(60) != 0
        assert "code: any" in d.log("worker0")
    finally:
        d.close()
