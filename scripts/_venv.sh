# Sourced by the scripts: create or reuse .venv and install mpl into it.
# A strict editable install maps mpl.* onto the source folders through a link tree, so a
# sub-package missing from pyproject.toml fails here as it would in a wheel. New files need a
# reinstall in that mode: the stamp covers pyproject.toml and the list of package files.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MPL_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

ensure_venv() {
  if [ ! -x "$PY" ]; then
    local base
    base="$(command -v python3.11 || command -v python3)"
    "$base" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
      || { echo "mpl needs Python 3.11 (spu ships cp311 wheels only); found $("$base" -V)" >&2; exit 1; }
    echo "creating $VENV" >&2
    "$base" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip setuptools wheel > "$VENV/install.log" 2>&1 \
      || { cat "$VENV/install.log" >&2; exit 1; }
  fi
  local stamp="$VENV/.mpl-install-stamp" want
  want="$( (cat "$ROOT/pyproject.toml"; cd "$ROOT" && find wire broker worker driver -name '*.py' -o -name py.typed | sort) | sha256sum | cut -c1-32)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing mpl (strict editable, with dev extras) into $VENV" >&2
    rm -rf "$ROOT/build/__editable__"*
    if ! "$PY" -m pip install -q -e "$ROOT[dev]" --config-settings editable_mode=strict \
        > "$VENV/install.log" 2>&1; then
      cat "$VENV/install.log" >&2
      echo "installing mpl failed (log above, also in $VENV/install.log)" >&2
      exit 1
    fi
    echo "$want" > "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
  export JAX_ENABLE_X64=1
}
