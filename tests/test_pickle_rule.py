"""One rule says whether a message from a given sender may carry pickles its receiver loads
(``mpl.wire.safe_values.pickles_allowed``); workers and drivers all ask it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mpl.wire.safe_values import BROKER, DRIVER, WORKER, pickles_allowed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("sender", "trusted", "secure", "allowed"),
    [
        # a listed driver ships code to its workers, whatever the cluster says
        (DRIVER, False, False, True),
        (DRIVER, False, True, True),
        (DRIVER, True, True, True),
        # the broker's cleartext: drivers' programs relayed in plaintext; sealed otherwise
        (BROKER, False, False, True),
        (BROKER, True, False, True),
        (BROKER, False, True, False),
        (BROKER, True, True, False),  # trusted never lets an untrusted broker ship code
        # another party's worker: moves, results, fetched values
        (WORKER, False, False, False),
        (WORKER, False, True, False),
        (WORKER, True, False, True),
        (WORKER, True, True, True),
    ],
)
def test_the_decision_table(sender: str, trusted: bool, secure: bool, allowed: bool) -> None:
    assert pickles_allowed(sender, trusted=trusted, secure=secure) is allowed  # type: ignore[arg-type]


def test_the_brokers_rule_needs_to_know_secure_mode_and_strangers_are_refused() -> None:
    with pytest.raises(ValueError, match="secure"):
        pickles_allowed(BROKER, trusted=False)
    with pytest.raises(ValueError, match="unknown sender"):
        pickles_allowed("outsider", trusted=True)  # type: ignore[arg-type]


def _safe_arguments(path: Path) -> list[str]:
    """Every ``safe=`` given in a call, and every ``safe`` assigned, as source text."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            found += [ast.unparse(k.value) for k in node.keywords if k.arg == "safe"]
        elif isinstance(node, ast.Assign) and any(
            ast.unparse(t) in ("safe", "self.safe") for t in node.targets
        ):
            found.append(ast.unparse(node.value))
    return found


@pytest.mark.parametrize("part", ["worker", "driver", "broker"])
def test_workers_drivers_and_the_broker_decide_nowhere_else(part: str) -> None:
    """A ``safe=`` decision made from ``trusted`` or secure mode outside the rule would let
    the parts drift apart: each is the rule's answer, a literal, or passed through."""
    for path in sorted((ROOT / part).glob("*.py")):
        for expr in _safe_arguments(path):
            # passed through: a part's own answer (the driver's call sites read their client's)
            passed = ("safe", "self.safe", "client.safe")
            assert expr in ("True", "False", *passed) or "pickles_allowed(" in expr, (
                f"{part}/{path.name}: safe={expr} decides without pickles_allowed"
            )
