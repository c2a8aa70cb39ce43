#!/usr/bin/env bash
# Two builds alternated in one run, each as a separate mqd and its own mqperf on loopback
# (docs/benchmarks.md, "Large bodies without tonic's copies"): per round and build, one mqperf
# invocation against a fresh mqd (temporary data dir, killed by its PID after the run); prints
# msg/s per op, the mqd's CPU seconds over the invocation and the load average.
#
# Usage: perf/scripts/separate_ab.sh BASE_BIN_DIR NEW_BIN_DIR MQPERF ARGS...
#   e.g. ... NOTX SENDANDRECEIVE '.\private$\ab' --payload string:1000000 --count 1000 \
#            --runs 1 --formatter raw --delivery express
# Environment: ROUNDS=3, PORT=18015
set -uo pipefail
BASE=${1:?usage: separate_ab.sh BASE_BIN_DIR NEW_BIN_DIR MQPERF ARGS...}
NEW=${2:?usage: separate_ab.sh BASE_BIN_DIR NEW_BIN_DIR MQPERF ARGS...}
shift 2
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18015}
TCK=$(getconf CLK_TCK)
for r in $(seq "$ROUNDS"); do
  for which in base new; do
    bin=$NEW
    [[ $which == base ]] && bin=$BASE
    dir=$(mktemp -d /tmp/separate-ab.XXXXXX)
    "$bin/mqd" --listen "127.0.0.1:$PORT" --data-dir "$dir" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    out=$(timeout 600 "$bin/mqperf" "$@" --broker "http://127.0.0.1:$PORT" --json 2>/dev/null)
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    rm -rf "$dir"
    ops=$(echo "$out" | python3 -c '
import json, sys
print(" ".join("%s=%.0f" % (r["op"], r["msgs_per_s"]) for r in map(json.loads, (l for l in sys.stdin if l.startswith("{")))))')
    echo "$r $which $ops mqd_cpu_s=$(awk -v a="$c0" -v b="$c1" -v t="$TCK" 'BEGIN { printf "%.2f", (b - a) / t }') load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
