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

# The status page's browser test (tests/test_ops_page.py) drives Debian's headless chromium.
# Install it when it is missing and this shell may (root with apt-get; about 10 s); anywhere
# else that one test skips and says why. MPL_NO_APT=1 skips the install.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    return 0
  fi
  if [ "${MPL_NO_APT:-0}" = 1 ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "chromium is not installed: the status page's browser test will skip" >&2
    return 0
  fi
  echo "installing chromium (Debian package) for the status page's browser test" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends chromium; } >/dev/null 2>&1; then
    echo "could not install chromium: the status page's browser test will skip" >&2
  fi
}
