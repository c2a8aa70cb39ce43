#!/usr/bin/env bash
# Closed-loop express mqperf of two builds alternated in one run, with the CPU time (user +
# sys) of each mqperf process (embedded broker included) from /usr/bin/time
# (docs/benchmarks.md, "Chunks of at most 8 KiB"). One line per round and build: cpu seconds,
# msgs/s of send, receive and e2e, the broker's RSS (MiB) at the end and the load before.
#
# Usage: perf/scripts/cpu_ab.sh BASE_BIN_DIR NEW_BIN_DIR PAYLOAD_BYTES COUNT
# Environment: ROUNDS=6, DELIVERY=express
set -euo pipefail
BASE=${1:?usage: cpu_ab.sh BASE_BIN_DIR NEW_BIN_DIR PAYLOAD_BYTES COUNT}
NEW=${2:?usage: cpu_ab.sh BASE_BIN_DIR NEW_BIN_DIR PAYLOAD_BYTES COUNT}
PAY=${3:?payload bytes}
COUNT=${4:?message count}
ROUNDS=${ROUNDS:-6}
DELIVERY=${DELIVERY:-express}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then order=(base new); else order=(new base); fi
  for v in "${order[@]}"; do
    bin=$NEW
    [[ $v == base ]] && bin=$BASE
    load=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -f "%U %S" -o "$tmp/time" timeout 900 "$bin/mqperf" NOTX SENDANDRECEIVE \
      '.\private$\perf' --formatter raw --runs 3 --payload "string:$PAY" --count "$COUNT" \
      --delivery "$DELIVERY" --json 2>/dev/null >"$tmp/json"
    cpu=$(awk '{print $1 + $2}' "$tmp/time")
    python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[4])]
rates = " ".join("%s %d" % (r["op"], round(r["msgs_per_s"])) for r in rows)
print("round", sys.argv[1], sys.argv[2], "cpu", sys.argv[3], rates,
      "rss", rows[-1].get("rss_mib"), "load", sys.argv[5])
' "$round" "$v" "$cpu" "$tmp/json" "$load"
  done
done
