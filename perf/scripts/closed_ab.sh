#!/usr/bin/env bash
# Closed-loop mqperf, two builds alternated in one run (docs/benchmarks.md, "Recoverable
# reads from memory"): prints one line per round, build and op (send, receive, e2e) with
# msgs/s, e2e p99 (µs), the embedded broker's RSS, the load average before the run and the
# CPU seconds (user + sys, from /usr/bin/time) of the whole mqperf process, broker included.
#
# Usage: perf/scripts/closed_ab.sh BASE_BIN_DIR NEW_BIN_DIR [MQPERF ARGS...]
# Default MQPERF ARGS: --payload string:1000 --count 100000 --delivery recoverable
# Environment: ROUNDS=4
set -euo pipefail
BASE=${1:?usage: closed_ab.sh BASE_BIN_DIR NEW_BIN_DIR [MQPERF ARGS...]}
NEW=${2:?usage: closed_ab.sh BASE_BIN_DIR NEW_BIN_DIR [MQPERF ARGS...]}
shift 2
ARGS=("$@")
((${#ARGS[@]})) || ARGS=(--payload string:1000 --count 100000 --delivery recoverable)
ROUNDS=${ROUNDS:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then order=(base new); else order=(new base); fi
  for v in "${order[@]}"; do
    bin=$NEW
    [[ $v == base ]] && bin=$BASE
    load=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -f "%U %S" -o "$tmp/time" timeout 900 "$bin/mqperf" NOTX SENDANDRECEIVE \
      '.\private$\perf' --formatter raw --runs 3 "${ARGS[@]}" --json 2>/dev/null >"$tmp/json"
    cpu=$(awk '{print $1 + $2}' "$tmp/time")
    python3 -c "
import json, sys
for line in open('$tmp/json'):
    r = json.loads(line)
    print('round $round $v', r['op'], 'msgs/s', round(r['msgs_per_s']), 'p99_us', round(r['p99_us']),
          'rss_mib', r.get('rss_mib'), 'load $load', 'cpu_s $cpu')
"
  done
done
