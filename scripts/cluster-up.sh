#!/usr/bin/env bash
# Start a broker and N workers (default 2; the examples need 3) in the background on free
# loopback ports. Logs, pids and the broker URL go to .mpl/run/ (or $MPL_RUN_DIR); the URL
# is printed on stdout.
# The broker's metrics and status page listen on a free loopback port: see $RUN/metrics.url.
# Stop them with scripts/cluster-down.sh.   Usage: scripts/cluster-up.sh [N]
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
source "$(dirname "$0")/_venv.sh"
ensure_venv
N="${1:-2}"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [N]   (N = number of workers, >= 1)" >&2; exit 2; }
RUN="${MPL_RUN_DIR:-$ROOT/.mpl/run}"
mkdir -p "$RUN"
for pidfile in "$RUN"/*.pid; do
  [ -e "$pidfile" ] || continue
  if kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "a cluster is already running (pids in $RUN); run scripts/cluster-down.sh first" >&2
    exit 1
  fi
  rm -f "$pidfile"
done

: > "$RUN/broker.out"
nohup "$VENV/bin/mpl-broker" --listen tcp://127.0.0.1:0 --world-size "$N" -v --metrics-port 0 \
  > "$RUN/broker.out" 2> "$RUN/broker.log" < /dev/null &
echo $! > "$RUN/broker.pid"

URL=""
for _ in $(seq 1 200); do  # up to 20 s
  URL="$(sed -n 's/^mpl-broker listening on \([^ ]*\).*/\1/p' "$RUN/broker.out")"
  [ -n "$URL" ] && break
  kill -0 "$(cat "$RUN/broker.pid")" 2>/dev/null || { cat "$RUN/broker.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$URL" ] || { echo "the broker did not start; see $RUN/broker.log" >&2; exit 1; }

for ((r = 0; r < N; r++)); do
  nohup "$VENV/bin/mpl-worker" --broker "$URL" --rank "$r" --data-root "$ROOT/.mpl/data/rank$r" -v \
    > "$RUN/worker$r.log" 2>&1 < /dev/null &
  echo $! > "$RUN/worker$r.pid"
done

"$PY" - "$URL" "$N" <<'PY'
import sys, time
from mpl.broker.query import query_status
url, n = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        up = [r for r in query_status(url, timeout=1)["ranks"] if r["state"] == "up"]
    except Exception:
        up = []
    if len(up) == n:
        sys.exit(0)
    time.sleep(0.05)
sys.exit(f"not all {n} workers joined within 30 s; see the worker logs")
PY
echo "$URL" > "$RUN/broker.url"
sed -n 's/^mpl-broker metrics on [^ ]*, status page on \(http[^ ]*\).*/\1/p' "$RUN/broker.out" > "$RUN/metrics.url"
echo "$URL"
