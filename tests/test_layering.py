"""Dependency direction, checked on the source: wire <- broker, worker, driver."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("wire", "broker", "worker", "driver")
# driver modules allowed to start broker and worker code (in-process simulator, local cluster)
LAUNCHERS = {"driver/simulator.py", "driver/launcher.py"}


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules(part: str) -> list[Path]:
    return sorted((ROOT / part).rglob("*.py"))


def test_parts_exist() -> None:
    for part in PARTS:
        assert modules(part), part


def test_wire_imports_nothing_of_ours() -> None:
    for path in modules("wire"):
        bad = {m for m in imports(path) if m.startswith("mpl.") and not m.startswith("mpl.wire")}
        assert not bad, f"{path.name} imports {bad}"


def test_broker_and_worker_never_import_each_other_or_the_driver() -> None:
    for part, banned in (
        ("broker", ("mpl.worker", "mpl.driver")),
        ("worker", ("mpl.broker", "mpl.driver")),
    ):
        for path in modules(part):
            bad = {m for m in imports(path) if m.startswith(banned)}
            assert not bad, f"{part}/{path.name} imports {bad}"


def test_only_launchers_in_the_driver_start_broker_or_worker_code() -> None:
    for path in modules("driver"):
        rel = str(path.relative_to(ROOT))
        bad = {m for m in imports(path) if m.startswith(("mpl.broker", "mpl.worker"))}
        assert rel in LAUNCHERS or not bad, f"{rel} imports {bad}"


def test_msgpack_and_cloudpickle_live_only_in_wire() -> None:
    for part in ("broker", "worker", "driver"):
        for path in modules(part):
            bad = {
                m for m in imports(path) if m.split(".")[0] in ("msgpack", "cloudpickle", "pickle")
            }
            assert not bad, f"{part}/{path.name} imports {bad}"


def test_jax_and_spu_are_never_imported_at_module_level() -> None:
    for part in PARTS:
        for path in modules(part):
            bad = {
                m for m in imports(path, top_level_only=True) if m.split(".")[0] in ("jax", "spu")
            }
            assert not bad, f"{part}/{path.name} imports {bad} at import time"
    for path in modules("broker"):
        assert not {m for m in imports(path) if m.split(".")[0] in ("jax", "spu")}, path.name


def test_the_broker_never_loads_sealing_nor_the_cryptography_package() -> None:
    """The broker routes sealed payloads without the means to open them: checked in a fresh
    process, since the import may come through wire."""
    import subprocess
    import sys

    code = (
        "import sys, mpl.broker.cli, mpl.broker.daemon; print(sorted(m for m in sys.modules "
        "if m.startswith('cryptography') or m == 'mpl.wire.seal'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
