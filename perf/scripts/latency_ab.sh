#!/usr/bin/env bash
# Open-loop latency, two mqperf builds alternated (docs/benchmarks.md, "Latency sweep, again").
# mqperf NOTX SENDANDRECEIVE 1000 B with its embedded broker, at PCTS percent of the given
# closed-loop e2e maxima (measure them first: the same command without --rate), --count 2 s
# of messages (at least 10,000), 3 runs each; prints one line per cell and build: achieved
# msgs/s and e2e p50/p99/p99.9 (µs) over the runs, and the load average before it.
#
# Usage: perf/scripts/latency_ab.sh BASE_BIN_DIR NEW_BIN_DIR
# Environment: ROUNDS=3 PCTS="50 10" EXPRESS_MAX=356468 RECOVERABLE_MAX=183980
#   DELIVERIES="express recoverable"
set -euo pipefail
BASE=${1:?usage: latency_ab.sh BASE_BIN_DIR NEW_BIN_DIR}
NEW=${2:?usage: latency_ab.sh BASE_BIN_DIR NEW_BIN_DIR}
ROUNDS=${ROUNDS:-3}
PCTS=${PCTS:-50 10}
DELIVERIES=${DELIVERIES:-express recoverable}
for round in $(seq "$ROUNDS"); do
  for d in $DELIVERIES; do
    for p in $PCTS; do
      max=${EXPRESS_MAX:-356468}
      [[ $d == recoverable ]] && max=${RECOVERABLE_MAX:-183980}
      rate=$((max * p / 100))
      count=$((rate * 2))
      ((count < 10000)) && count=10000
      if ((round % 2)); then order=(base new); else order=(new base); fi
      for v in "${order[@]}"; do
        bin=$NEW
        [[ $v == base ]] && bin=$BASE
        load=$(cut -d' ' -f1 /proc/loadavg)
        timeout 600 "$bin/mqperf" NOTX SENDANDRECEIVE '.\private$\perf' --payload string:1000 \
          --formatter raw --count "$count" --runs 3 --delivery "$d" --rate "$rate" --json 2>/dev/null |
          python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r.get('op') == 'e2e':
        print('round $round $v $d $p%', 'achieved', round(r['msgs_per_s']), 'p50', r['p50_us'],
              'p99', r['p99_us'], 'p99.9', r['p999_us'], 'load $load')
"
      done
    done
  done
done
