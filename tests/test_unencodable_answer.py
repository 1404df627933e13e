"""A secure Done whose value is a short str UTF-8 cannot encode (a lone surrogate, as
``bytes.decode("utf-8", "surrogateescape")`` makes) fails its job with the reason, as
``WorkerSeal.outbound`` fails any other value it cannot seal. Found in review (w26, older
than that round): ``Sealer.seal_scalars`` ran before outbound's ``try``, so msgpack's
``UnicodeEncodeError`` escaped it, the thread posting the answer (a pool thread, or the I/O
thread for an inline run that is not compiled) got the exception, and the job's driver got
no answer (it waited out its timeout)."""

from __future__ import annotations

from helpers import sealer_pair

from mpl.wire.jobs import Done, Exec, Failed
from mpl.wire.seal import exec_context
from mpl.worker.sealing import WorkerSeal


def test_an_answer_utf8_cannot_encode_fails_its_job_with_the_reason() -> None:
    driver, node = sealer_pair()
    worker = WorkerSeal(node, 0)
    context = exec_context("s", "j", "d", (0,), (0,), 5.0)
    exec_ = Exec("s", "j", "d", (0,), {0: driver.seal(None, "node:n0", context)}, (0,), 5.0)
    assert worker.open_exec(exec_, "j", exec_.bindings[0]) is None
    answer = worker.outbound(Done("s", "j", 0, {0: b"\xff".decode("utf-8", "surrogateescape")}))
    assert type(answer) is Failed and answer.job == "j"
