#!/usr/bin/env bash
# One separate mqd serving both loopback TCP and a Unix socket (--unix-socket), and mqperf
# against each in turn, alternated (docs/benchmarks.md, "Express latency at half the maximum"):
# closed-loop 1000 B express send/receive/e2e, then open-loop e2e at RATES with the machine's
# busy share (perf/scripts/e2e_cpu.py). mqd is stopped by its PID at the end.
#
# Usage: perf/scripts/unix_ab.sh BIN_DIR [PORT]
# Environment: ROUNDS=3 RATES="28000 84000 140000" COUNT=300000
set -euo pipefail
BIN=${1:?usage: unix_ab.sh BIN_DIR [PORT]}
PORT=${2:-18431}
ROUNDS=${ROUNDS:-3}
RATES=${RATES:-28000 84000 140000}
COUNT=${COUNT:-300000}
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d /tmp/unix-ab.XXXXXX)
SOCK=$DIR/mqd.sock
"$BIN/mqd" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" --unix-socket "$SOCK" \
  >"$DIR/mqd.out" 2>"$DIR/mqd.err" &
MQD=$!
trap 'kill "$MQD" 2>/dev/null; wait "$MQD" 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$DIR/mqd.out" && break; sleep 0.1; done
declare -A URL=([tcp]="http://127.0.0.1:$PORT" [unix]="unix:$SOCK")
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then order=(tcp unix); else order=(unix tcp); fi
  for t in "${order[@]}"; do
    "$BIN/mqperf" NOTX SENDANDRECEIVE '.\private$\ab' --broker "${URL[$t]}" --payload string:1000 \
      --formatter raw --count "$COUNT" --runs 1 --json 2>/dev/null | python3 -c "
import json, sys
d = {}
for l in sys.stdin:
    x = json.loads(l)
    if x.get('op'): d[x['op']] = round(x['msgs_per_s'])
print('round $round $t closed loop: send', d.get('send'), 'receive', d.get('receive'), 'e2e', d.get('e2e'))"
  done
  for r in $RATES; do
    for t in "${order[@]}"; do
      echo -n "round $round $t open loop: "
      MQPERF_ARGS="--broker ${URL[$t]}" python3 "$HERE/e2e_cpu.py" "$BIN/mqperf" "$r"
    done
  done
done
