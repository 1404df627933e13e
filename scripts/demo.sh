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
if [ -s "$MPL_RUN_DIR/metrics.url" ]; then
  echo "   its status page (open it while the demo runs): $(cat "$MPL_RUN_DIR/metrics.url")"
  echo "   Prometheus metrics: $(cat "$MPL_RUN_DIR/metrics.url")metrics"
fi

examples=(millionaire party_files party_stats pipeline)  # pipeline last: its trace spans 3 ranks
long=(secure_stats logistic_regression)
if [ "$SHORT" = 0 ]; then examples+=("${long[@]}"); fi
TRACE="$MPL_RUN_DIR/last-job.trace.json"
rm -f "$TRACE"
last="${examples[-1]}"
for name in "${examples[@]}"; do
  echo
  echo "== examples/$name.py: $(sed -n '1s/^"""//p' "examples/$name.py")"
  if [ "$name" = "$last" ]; then
    MPL_TRACE="$TRACE" "$PY" "examples/$name.py" --url "$URL"
  else
    "$PY" "examples/$name.py" --url "$URL"
  fi
done
echo
echo "== the cluster now: mpl-broker status $URL"
"$VENV/bin/mpl-broker" status "$URL"
echo
echo "== a Perfetto trace of the last job (examples/$last.py): $TRACE"
echo "   open https://ui.perfetto.dev and drop the file on it (or use chrome://tracing):"
echo "   one row per rank, one span per op"
echo
echo "== examples/millionaire.py --secure: the same on a local cluster in secure mode (CurveZMQ)"
"$PY" examples/millionaire.py --secure
