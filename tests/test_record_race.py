"""A record decoded while another thread is still importing (defining) its class."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from helpers import wait_until

from mpl.wire.record import Record, record_from_fields

GATE = """
import threading
EVENT = threading.Event()
"""

RACY = """
from dataclasses import dataclass

from racegate import EVENT

from mpl.wire.record import Record


def hold(cls):
    EVENT.wait(10)  # the class is registered by now, but not yet a dataclass
    return cls


@dataclass(eq=False, repr=False)
@hold
class RaceRecord(Record, tag="test-race-record"):
    x: int
"""


def test_a_record_whose_class_is_still_being_defined_waits_for_it(tmp_path: Path) -> None:
    (tmp_path / "racegate.py").write_text(GATE)
    (tmp_path / "racemod.py").write_text(RACY)
    sys.path.insert(0, str(tmp_path))
    try:
        import racegate  # type: ignore[import-not-found]  # written to tmp_path just above

        importer = threading.Thread(target=lambda: __import__("racemod"), daemon=True)
        importer.start()
        wait_until(lambda: "test-race-record" in Record._registry, what="the class to register")
        cls = Record._registry["test-race-record"]
        built: list[object] = []
        errors: list[BaseException] = []

        def decode() -> None:  # what the I/O thread does with an arriving record
            try:
                built.append(record_from_fields(cls, [7]))
            except BaseException as exc:
                errors.append(exc)

        decoder = threading.Thread(target=decode, daemon=True)
        decoder.start()
        # the decoder got its answer (before: a refusal) or waits for the import to finish
        wait_until(lambda: errors or built or _importing(decoder), what="the decoder to try")
        racegate.EVENT.set()  # the import may finish now
        decoder.join(10)
        importer.join(10)
        assert not errors, f"before, the record was refused: {errors}"
        assert getattr(built[0], "x", None) == 7
    finally:
        sys.path.remove(str(tmp_path))
        Record._registry.pop("test-race-record", None)
        for name in ("racemod", "racegate"):
            sys.modules.pop(name, None)


def _importing(thread: threading.Thread) -> bool:
    """True while ``thread`` is inside the import machinery."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if "importlib" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False
