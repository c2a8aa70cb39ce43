#!/usr/bin/env bash
# One long-lived separate mqd and N invocations of one express cell of the table
# (docs/benchmarks.md, "The table with the final build"): per invocation mqd's RSS
# before it, mqd's minor page faults during it (/proc/PID/stat) and the msg/s of each phase.
# mqd is stopped by its PID.
# Usage: perf/scripts/warm_cell.sh BIN_DIR [N]
# Environment: P=1000000 (payload bytes), C=1000 (count), GAP=5 (seconds between invocations),
#   PORT=18098
set -u
BIN=${1:?usage: warm_cell.sh BIN_DIR [N]}
N=${2:-4}
PORT=${PORT:-18098}
D=$(mktemp -d /tmp/warm-cell.XXXXXX)
"$BIN/mqd" --listen "127.0.0.1:$PORT" --data-dir "$D/data" >"$D/log" 2>&1 &
M=$!
trap 'kill $M 2>/dev/null; wait $M 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
for i in $(seq "$N"); do
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$M/status")
  f0=$(awk '{print $10}' "/proc/$M/stat")
  out=$("$BIN/mqperf" NOTX SENDANDRECEIVE '.\private$\it' --payload "string:${P:-1000000}" \
    --count "${C:-1000}" --delivery express --formatter raw --runs 1 \
    --broker "http://127.0.0.1:$PORT" --json 2>/dev/null | python3 -c '
import json, sys
print(" ".join("%s %d" % (r["op"], r["msgs_per_s"]) for r in map(json.loads, sys.stdin)))')
  f1=$(awk '{print $10}' "/proc/$M/stat")
  echo "invocation $i rss_before_kib $rss minor_faults $((f1 - f0)) $out"
  sleep "${GAP:-5}"
done
