#!/usr/bin/env bash
# The fan-out shape against mq and the peers (docs/benchmarks.md, "Fan-out, side by side"):
# for each target, one client on one queue, then 200 senders, 1,000 queues and 1,000 consumers
# (--clients 200 --queues 1000 --consumers 1000), NOTX SENDANDRECEIVE 1000 B raw, delivery
# DELIVERY (express), --count COUNT --runs RUNS; ROUNDS rounds. mq runs against a separate mqd (127.0.0.1:18011);
# RabbitMQ and NATS as perf/scripts/peer_servers.sh starts them. Prints one JSON row per op
# and invocation (with "shape" and "round" added) to stdout; summarize with
# perf/scripts/fanout_peers.py.
#
# Usage: BIN=target/release [ROUNDS=2] [COUNT=200000] [RUNS=3] [DELIVERY=express|recoverable] \
#   perf/scripts/fanout_peers.sh > OUT.jsonl
set -uo pipefail
BIN=${BIN:?set BIN to the directory of mqd and mqperf}
ROUNDS=${ROUNDS:-2} COUNT=${COUNT:-200000} RUNS=${RUNS:-3} DELIVERY=${DELIVERY:-express}
source "$(dirname "$0")/peer_servers.sh"
TARGETS=("mq" "amqp://guest:guest@127.0.0.1:5672" "nats://127.0.0.1:4222")
for round in $(seq "$ROUNDS"); do
  for t in "${TARGETS[@]}"; do
    for shape in one spread; do
      args=(NOTX SENDANDRECEIVE '.\private$\fan' --formatter raw --payload string:1000
            --count "$COUNT" --runs "$RUNS" --delivery "$DELIVERY" --json --target "$t")
      [ "$t" = mq ] && args+=(--broker http://127.0.0.1:18011)
      [ "$shape" = spread ] && args+=(--clients 200 --queues 1000 --consumers 1000)
      echo "round $round $shape $t" >&2
      timeout 1800 "$BIN/mqperf" "${args[@]}" 2>>"$TMP/err.log" \
        | python3 -c "
import json, sys
for l in sys.stdin:
    if l.startswith('{'):
        r = json.loads(l); r['shape'] = '$shape'; r['round'] = $round; print(json.dumps(r))" \
        || { echo "mqperf failed: ${args[*]}" >&2; tail -5 "$TMP/err.log" >&2; }
    done
  done
done
