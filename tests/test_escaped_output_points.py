"""Every place text from the network is printed, raised or logged shows it escaped.

R32-2 escapes (``wire/printable.py``: ``printable``, ``one_line``) text that a party or a
broker wrote wherever it reaches a reader: an error rebuilt from the wire (a raised
``Refused`` among them), the status table, ``mpl-broker status`` listings, ``repr`` of a
``Value``, a progress report's op, the daemons' text log and what a daemon echoes when it
stops. Each output point below is fed one hostile text (an ESC sequence that clears the
screen, an OSC 52 clipboard write, a bidi override, U+2028 and a newline: each forges or
hides what the reader sees) and what comes out is checked. The two scans at the end catch a
new output point that skips the escaping where a rule can say so: an exception or an echo
built from an error's text outside ``wire/remote.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import fake_broker, wait_until

from mpl.driver.client import Client
from mpl.driver.launcher import daemon_command
from mpl.driver.values import Value
from mpl.wire import errors
from mpl.wire.codec import decode, encode, from_wire, to_wire
from mpl.wire.control import Refused, WorkerHello
from mpl.wire.graph import Graph
from mpl.wire.jobs import Exec
from mpl.wire.logs import LOG_FORMATS, configure_logging
from mpl.wire.progress import Progress
from mpl.wire.remote import _KINDS, ErrorInfo, from_info
from mpl.wire.status import format_status

HOSTILE = "boom\x1b[2J\x1b]52;c;ZWNobyBvd25lZA==\x07\u202e\u2028forged\nline"
_RAW = ("\x1b", "\x07", "\u202e", "\u2028")
_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("wire", "broker", "worker", "driver")


def assert_escaped(shown: str, *, one_line: bool = True) -> None:
    """``shown`` holds HOSTILE escaped: none of its raw controls, its ESC shown as ``\\x1b``
    and, on one line, its newline escaped too."""
    for raw in _RAW:
        assert raw not in shown, (raw, shown[:300])
    assert "\\x1b" in shown, shown[:300]  # shown, not dropped
    if one_line:
        assert "forged\nline" not in shown, shown[:300]


# -- errors rebuilt from the wire ----------------------------------------------------------


def _hostile_info(kind: str) -> ErrorInfo:
    """An ErrorInfo of ``kind`` whose every text field (however many it has) is HOSTILE."""
    fields = dataclasses.fields(ErrorInfo)
    text = {f.name: HOSTILE for f in fields if f.type in (str, "str") and f.name != "kind"}
    assert {"message", "op", "remote_type", "traceback", "job"} <= set(text)
    return dataclasses.replace(ErrorInfo(kind, ""), **text, rank=1)


@pytest.mark.parametrize("kind", [*_KINDS, "NoSuchKind", "PermissionError"])
def test_every_error_rebuilt_from_the_wire_is_escaped(kind: str) -> None:
    exc = from_info(_hostile_info(kind))
    assert_escaped(str(exc), one_line=False)
    for arg in exc.args:
        assert_escaped(arg, one_line=False)
    for name, value in vars(exc).items():
        if isinstance(value, str) and value:
            # a traceback keeps its lines, each other field is one line
            assert_escaped(value, one_line=name not in ("remote_message", "remote_traceback"))


def test_a_refusal_a_driver_raises_is_escaped() -> None:
    """A broker's ``Refused`` (any request's, and a job's in flight) is raised as the error
    it carries: through ``from_info``, so escaped, on the call and on the future alike."""

    def answer(router: zmq.Socket[Any], peer: bytes, frames: list[bytes]) -> None:
        try:
            msg = decode(from_wire(frames), unpickle=False)
        except Exception:  # what a fake broker cannot read, it ignores
            return
        if isinstance(msg, Exec) or getattr(msg, "req", None) is not None:
            refused = Refused(ErrorInfo("SessionError", HOSTILE, job=HOSTILE))
            router.send_multipart([peer, *to_wire(encode(refused))])

    with fake_broker(answer) as address:
        client = Client(address, timeout=10.0)
        try:
            with pytest.raises(errors.SessionError) as caught:
                client.fetch("s", 0, "obj:1")
            assert_escaped(str(caught.value), one_line=False)
            future = client.submit_async("s", Graph(1, (), (), ()), {})
            with pytest.raises(errors.MplError) as in_flight:
                future.result(20)
            assert_escaped(str(in_flight.value), one_line=False)
        finally:
            client.close()


# -- tables and descriptions --------------------------------------------------------------


def _status(text: str) -> dict[str, Any]:
    """A status report whose every text field a broker writes (or relays) is ``text``."""
    row = {"rank": 0, "state": text, "pid": text, "host": text, "heartbeat_age_s": 0.1}
    row |= {"objects": text, "jobs_running": text}
    session = {"session": text, "name": text}
    progress = {text: {"rank": 1, "done": 1, "total": 2, "op": text, "elapsed_s": 1.0}}
    return {
        "broker_id": text,
        "world_size": text,
        "ranks": [row],
        "sessions": [session],
        "progress": progress,
        "errors": [text],
    }


def test_the_status_table_is_escaped_and_keeps_its_lines() -> None:
    shown = format_status(_status(HOSTILE))
    assert_escaped(shown, one_line=False)
    assert "forged\nline" not in shown
    assert shown.count("\n") == format_status(_status("plain")).count("\n")


def test_the_brokers_listings_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """``mpl-broker status --sessions`` and ``--symbols``, as printed (their rows, and the
    count of other drivers' sessions the broker reports)."""
    from mpl.broker.cli import _print_listing

    session = dict.fromkeys(
        ("session", "name", "owner", "drivers", "idle_s", "lease_s", "symbols", "jobs"), HOSTILE
    )
    name = dict.fromkeys(("name", "rank", "device", "parties", "meta", "size_bytes"), HOSTILE)
    for report, sessions in (
        ({"sessions": [session], "other_sessions": HOSTILE}, True),
        ({"persisted": [name]}, False),
    ):
        _print_listing(report, sessions, False)
        shown = capsys.readouterr().out
        assert_escaped(shown)


def test_a_values_description_and_a_progress_op_are_escaped() -> None:
    assert_escaped(repr(Value("P0", (0,), meta=HOSTILE)))
    client = Client("tcp://127.0.0.1:9", timeout=1.0)  # never dialled
    try:
        board = client.progress
        board.begin("j1")
        board.update(Progress("s", "j1", 0, 1, 2, HOSTILE))
        p = board.get("j1")
        assert p is not None
        assert_escaped(p.ranks[0][2])
    finally:
        client.close()


# -- the daemons' logs and what they echo ----------------------------------------------------


@pytest.fixture
def daemon_formatters() -> dict[str, logging.Formatter]:
    """The formatters ``configure_logging`` gives a daemon, by log format; the root logger
    is restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    made: dict[str, logging.Formatter] = {}
    try:
        for log_format in LOG_FORMATS:
            configure_logging("broker", 0, log_format)
            formatter = root.handlers[0].formatter
            assert formatter is not None
            made[log_format] = formatter
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
    return made


def _records() -> list[logging.LogRecord]:
    """A line quoting a peer, and a line with an exception that quotes one attached."""
    try:
        raise ValueError(f"a peer said {HOSTILE}")
    except ValueError:
        exc_info = sys.exc_info()
    return [
        logging.LogRecord("mpl", logging.ERROR, __file__, 1, "bad %s", (HOSTILE,), None),
        logging.LogRecord("mpl", logging.ERROR, __file__, 1, "bad %s", (1,), exc_info),
    ]


def test_a_daemons_text_log_line_and_its_traceback_are_escaped(
    daemon_formatters: dict[str, logging.Formatter],
) -> None:
    """A peer's text reaches the log in a message's arguments and in the text of an
    exception logged with it (``Guard.internal`` logs one with its traceback): both are
    escaped, and no line a peer's newline starts begins at the margin, as a log line does."""
    quoted, with_traceback = (daemon_formatters["text"].format(r) for r in _records())
    assert_escaped(quoted)
    assert_escaped(with_traceback, one_line=False)
    lines = with_traceback.splitlines()
    assert lines[0].endswith("ERROR bad 1") and all(line.startswith(" ") for line in lines[1:])


def test_a_daemons_json_log_line_is_one_line_of_escaped_json(
    daemon_formatters: dict[str, logging.Formatter],
) -> None:
    for record in _records():
        shown = daemon_formatters["json"].format(record)
        for raw in (*_RAW, "\n"):
            assert raw not in shown
        line = json.loads(shown)
        assert HOSTILE in line["message"] + line.get("error", "")  # as it came, for a tool


@pytest.mark.daemons
def test_a_worker_refused_by_its_broker_echoes_the_reason_escaped(tmp_path: Path) -> None:
    """``mpl-worker`` refused at registration prints the broker's reason as it exits: a
    hostile broker's text, escaped (a real worker process, a raw ROUTER for the broker)."""

    def answer(router: zmq.Socket[Any], peer: bytes, frames: list[bytes]) -> None:
        try:
            msg = decode(from_wire(frames), unpickle=False)
        except Exception:
            return
        if isinstance(msg, WorkerHello):
            refused = Refused(ErrorInfo("RegistrationError", HOSTILE))
            router.send_multipart([peer, *to_wire(encode(refused))])

    with fake_broker(answer) as address:
        cmd = [*daemon_command("mpl-worker"), "--broker", address, "--rank", "0"]
        cmd += ["--data-root", str(tmp_path / "data")]
        err = tmp_path / "worker.err"
        with open(err, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=out)
        try:
            wait_until(lambda: proc.poll() is not None, 60, "the refused worker to exit")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    echoed = [line for line in err.read_text().splitlines() if "refused:" in line]
    assert proc.returncode == 3 and echoed, err.read_text()[-2000:]
    assert_escaped("\n".join(echoed))
    assert not any(line.startswith("line") for line in err.read_text().splitlines())


# -- rules a new output point is held to -------------------------------------------------------

# the text fields of an error from the wire (ErrorInfo's, as RemoteError keeps them)
_ERROR_TEXT = {"message", "traceback", "remote_type", "remote_message", "remote_traceback"}
_ESCAPES = {"printable", "one_line"}
# where text is shown to a reader: an echo, a print, a usage error click prints
_SINKS = {"echo", "secho", "print", "ClickException", "UsageError", "BadParameter"}


def _called(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def _unescaped_reads(node: ast.AST) -> list[str]:
    """The error-text attributes ``node`` reads outside a printable/one_line call."""
    if isinstance(node, ast.Call) and _called(node) in _ESCAPES:
        return []
    found = [node.attr] if isinstance(node, ast.Attribute) and node.attr in _ERROR_TEXT else []
    for child in ast.iter_child_nodes(node):
        found += _unescaped_reads(child)
    return found


def test_no_error_or_echo_is_built_from_an_errors_text_unescaped() -> None:
    """An exception of ``mpl.wire.errors``, or an echo to the terminal, whose arguments
    read an error's text (``.message``, ``.traceback``, ``.remote_type``...) does so
    through ``printable``/``one_line`` (``from_info`` builds them so). A new such path
    written without it fails here; a log call needs none (the daemons' formatter escapes
    every line, see above)."""
    classes = {
        name
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, BaseException)
    }
    assert {"RemoteError", "SessionError", "WorkerLostError"} <= classes
    found = []
    for package in _PACKAGES:
        for path in sorted((_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and _called(node) in classes | _SINKS):
                    continue
                args = [*node.args, *(k.value for k in node.keywords)]
                reads = [read for arg in args for read in _unescaped_reads(arg)]
                if reads:
                    found.append(f"{path.relative_to(_ROOT)}:{node.lineno} {reads}")
    assert found == []


def test_the_scan_finds_what_it_is_meant_to() -> None:
    """The rule above, on a line that breaks it and on one that keeps it."""
    broken = ast.parse("click.echo(f'refused: {worker.refused.message}')").body[0]
    kept = ast.parse("click.echo(f'refused: {one_line(worker.refused.message)}')").body[0]
    assert isinstance(broken, ast.Expr) and isinstance(kept, ast.Expr)
    assert _unescaped_reads(broken.value) == ["message"]
    assert _unescaped_reads(kept.value) == []


def test_every_error_class_a_worker_or_broker_may_name_is_rebuilt_by_from_info() -> None:
    """An error crosses the wire by its class's name and is rebuilt by ``from_info`` (an
    unknown name as RemoteError): each of ``mpl.wire.errors``' classes either is among
    the names it rebuilds as themselves or falls back, escaped either way (above)."""
    for name, cls in vars(errors).items():
        if inspect.isclass(cls) and issubclass(cls, errors.MplError):
            rebuilt = from_info(_hostile_info(name))
            assert type(rebuilt) is _KINDS.get(name, errors.RemoteError) or (
                name == "RemoteError" and isinstance(rebuilt, errors.RemoteError)
            )
            assert_escaped(str(rebuilt), one_line=False)


def _bare_names_logged(path: Path) -> list[str]:
    """``log.<level>(...)`` calls in ``path`` that pass a caught exception (a bare name
    bound by ``except ... as``) without ``one_line``/``printable`` around it."""
    tree = ast.parse(path.read_text(), str(path))
    caught = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "log"):
            continue
        bare = [a.id for a in node.args[1:] if isinstance(a, ast.Name) and a.id in caught]
        if bare:
            found.append(f"{path.relative_to(_ROOT)}:{node.lineno} {bare}")
    return found


def test_the_driver_logs_a_brokers_error_text_escaped() -> None:
    """The driver logs through the application's own logging, which escapes nothing (the
    daemons' formatter does, the user's need not): a refused message's error, whose text
    may quote what the broker sent, is logged through ``one_line``."""
    found = [
        f for path in sorted((_ROOT / "driver").rglob("*.py")) for f in _bare_names_logged(path)
    ]
    assert found == []
