#!/usr/bin/env bash
# The run command. From a fresh clone: create or reuse .venv, install mpl, start a local
# cluster of real daemons (one broker, 3 workers, loopback only), run every program in
# examples/ against it, and stop the cluster (also on failure or Ctrl-C).
#   scripts/demo.sh            all examples
#   scripts/demo.sh --short    the quick ones (what CI runs)
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
ensure_venv
cd "$ROOT"
SHORT=0
case "${1:-}" in
  --short) SHORT=1 ;;
  "") ;;
  -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--short]" >&2; exit 2 ;;
esac

export MPL_RUN_DIR="$ROOT/.mpl/demo-run"
"$ROOT/scripts/cluster-down.sh" > /dev/null  # a demo cluster left over from a killed run
trap '"$ROOT/scripts/cluster-down.sh" > /dev/null' EXIT
echo "== starting a local cluster: mpl-broker + 3 mpl-worker (logs in $MPL_RUN_DIR)"
URL="$("$ROOT/scripts/cluster-up.sh" 3)"
echo "   broker at $URL"

examples=(millionaire party_stats pipeline party_files)
long=(secure_stats logistic_regression)
if [ "$SHORT" = 0 ]; then examples+=("${long[@]}"); fi
for name in "${examples[@]}"; do
  echo
  echo "== examples/$name.py: $(sed -n '1s/^"""//p' "examples/$name.py")"
  "$PY" "examples/$name.py" --url "$URL"
done
echo
echo "== examples/millionaire.py --secure: the same on a local cluster in secure mode (CurveZMQ)"
"$PY" examples/millionaire.py --secure
echo
"$VENV/bin/mpl-broker" status "$URL" | head -6
