#!/usr/bin/env bash
# Stop the cluster scripts/cluster-up.sh started: SIGTERM each pid, SIGKILL after 5 s.
# Pids are read from .mpl/run/ (or $MPL_RUN_DIR).   Usage: scripts/cluster-down.sh
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0   (no arguments; the run folder is \$MPL_RUN_DIR or .mpl/run)" >&2; exit 2 ;;
esac
RUN="${MPL_RUN_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.mpl/run}"
shopt -s nullglob
pidfiles=("$RUN"/*.pid)
if [ ${#pidfiles[@]} -eq 0 ]; then
  echo "no cluster is running (no pid files in $RUN)"
  exit 0
fi
for f in "${pidfiles[@]}"; do kill -TERM "$(cat "$f")" 2>/dev/null || true; done
for f in "${pidfiles[@]}"; do
  pid="$(cat "$f")"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "pid $pid ignored SIGTERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
done
rm -f "$RUN/broker.url" "$RUN/metrics.url"
echo "stopped ${#pidfiles[@]} processes"
