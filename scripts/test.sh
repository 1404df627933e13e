#!/usr/bin/env bash
# The test command. From a fresh clone: create or reuse .venv, install mpl with its dev
# extras, then run ruff (lint, and format check), mypy (strict) and pytest. Exits non-zero
# on any failure.
# Extra arguments go to pytest, e.g. scripts/test.sh -k codec -x
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
ensure_venv
ensure_chromium
cd "$ROOT"
echo "== ruff" >&2
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy" >&2
"$PY" -m mypy -p mpl.wire -p mpl.broker -p mpl.worker -p mpl.driver
"$PY" -m mypy scripts tests  # files, not packages: mypy takes one kind per run
echo "== pytest" >&2
"$PY" -m pytest "$@"
