#!/usr/bin/env bash
# Does the cell before change the express 1 MB send? (docs/benchmarks.md, "The issue's table
# with the final build"). With RabbitMQ, NATS and a separate mqd started as by
# peer_servers.sh, REPS times: the express 100 KB cell of the issue's table with all three
# targets (not printed), then the express 1 MB cell with the targets in the order ORDER:
# "mq-first" (the table's order), "mq-last" or "mq-only". Prints msg/s per target and phase.
# Usage (after `cargo build --release -p mq-broker -p mq-perf`): perf/scripts/order_probe.sh
# Environment: BIN, REPS=3, ORDER="mq-first mq-last" (each order in turn per repetition)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
. "$ROOT/perf/scripts/peer_servers.sh"
MQ=(--target mq --broker http://127.0.0.1:18011)
RABBIT=(--target amqp://guest:guest@127.0.0.1:5672)
NATS=(--target nats://127.0.0.1:4222)
cell() { # payload count targets...
  local p=$1 c=$2; shift 2
  timeout 600 "$BIN/mqperf" NOTX SENDANDRECEIVE '.\private$\it' --payload "string:$p" --count "$c" \
    --delivery express --formatter raw --runs 1 "$@" --json 2>/dev/null
}
for i in $(seq "${REPS:-3}"); do
  for order in ${ORDER:-mq-first mq-last}; do
    case $order in
      mq-first) t=("${MQ[@]}" "${RABBIT[@]}" "${NATS[@]}") ;;
      mq-last) t=("${NATS[@]}" "${RABBIT[@]}" "${MQ[@]}") ;;
      mq-only) t=("${MQ[@]}") ;;
      *) echo "unknown order $order" >&2; exit 2 ;;
    esac
    cell 100000 10000 "${MQ[@]}" "${RABBIT[@]}" "${NATS[@]}" >/dev/null
    echo "rep $i $order: $(cell 1000000 1000 "${t[@]}" | python3 -c '
import json, sys
print(" ".join("%s:%s %d" % (r.get("target", "?")[:5], r["op"], r["msgs_per_s"])
               for r in map(json.loads, sys.stdin)))')"
  done
done
