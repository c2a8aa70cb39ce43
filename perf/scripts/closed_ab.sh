#!/usr/bin/env bash
# Closed-loop mqperf, two builds alternated in one run (docs/benchmarks.md, "Recoverable
# reads from memory"): prints one line per round, build and op (send, receive, e2e) with
# msgs/s, e2e p99 (µs), the embedded broker's RSS and the load average before the run.
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
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then order=(base new); else order=(new base); fi
  for v in "${order[@]}"; do
    bin=$NEW
    [[ $v == base ]] && bin=$BASE
    load=$(cut -d' ' -f1 /proc/loadavg)
    timeout 900 "$bin/mqperf" NOTX SENDANDRECEIVE '.\private$\perf' --formatter raw --runs 3 \
      "${ARGS[@]}" --json 2>/dev/null |
      python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print('round $round $v', r['op'], 'msgs/s', round(r['msgs_per_s']), 'p99_us', round(r['p99_us']),
          'rss_mib', r.get('rss_mib'), 'load $load')
"
  done
done
