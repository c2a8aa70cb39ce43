#!/usr/bin/env bash
# The cells of issue 14's table, mq (a separate mqd) against RabbitMQ and NATS JetStream, each
# cell one mqperf invocation with the three targets one after another
# (docs/benchmarks.md, "The issue's table again").
# Usage (after `cargo build --release -p mq-broker -p mq-perf`):
#   perf/scripts/issue_table.sh > OUT.jsonl   (JSON rows of mqperf, each with a "cell" field)
# Environment: BIN, ROUNDS=2, CELLS (names of the cells to run, space-separated; default all).
# The first tries of a cell are retried while RabbitMQ starts.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
ROUNDS=${ROUNDS:-2}
. "$ROOT/perf/scripts/peer_servers.sh"
T=(--target mq --broker http://127.0.0.1:18011 --target amqp://guest:guest@127.0.0.1:5672 --target nats://127.0.0.1:4222)
cell() { # name mqperf-args... (MQ_ONLY=1: mq alone, else all three)
  local name=$1; shift
  [ -n "${CELLS:-}" ] && [[ " $CELLS " != *" $name "* ]] && return 0
  local targets=("${T[@]}"); [ -n "${MQ_ONLY:-}" ] && targets=(--target mq --broker http://127.0.0.1:18011)
  local out; for a in 1 2 3 4 5; do out=$(timeout 600 $BIN/mqperf "$@" --formatter raw --runs 1 "${targets[@]}" --json 2>$TMP/err) && break; sleep 3; done
  echo "$out" | python3 -c "
import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith('{'):
        r=json.loads(l); r['cell']='$name'; r['load']=open('/proc/loadavg').read().split()[0]; print(json.dumps(r), flush=True)
"
}
for r in $(seq $ROUNDS); do
  cell express-100KB NOTX SENDANDRECEIVE '.\private$\it' --payload string:100000 --count 10000 --delivery express
  cell express-1MB NOTX SENDANDRECEIVE '.\private$\it' --payload string:1000000 --count 1000 --delivery express
  cell recoverable-1000B NOTX SENDANDRECEIVE '.\private$\it' --payload string:1000 --count 100000 --delivery recoverable
  cell recoverable-100KB NOTX SENDANDRECEIVE '.\private$\it' --payload string:100000 --count 10000 --delivery recoverable
  cell recoverable-1MB NOTX SENDANDRECEIVE '.\private$\it' --payload string:1000000 --count 1000 --delivery recoverable
  cell tx-one-at-a-time TX SENDANDRECEIVE '.\private$\itx' --payload string:1000 --count 3000 --one-at-a-time
  MQ_ONLY=1 cell tx-one-at-a-time-rac TX SENDANDRECEIVE '.\private$\itx' --payload string:1000 --count 3000 --one-at-a-time --receive-and-commit
  cell tx-send-one TX SENDANDRECEIVE '.\private$\itx' --payload string:1000 --count 3000 --send-one --receive-one
  cell send-one-express NOTX SENDANDPURGE '.\private$\it' --payload string:1000 --count 3000 --delivery express --send-one
  cell send-one-recoverable NOTX SENDANDPURGE '.\private$\it' --payload string:1000 --count 3000 --delivery recoverable --send-one
  cell receive-one-express NOTX SENDANDRECEIVE '.\private$\it' --payload string:1000 --count 3000 --delivery express --receive-one
  cell receive-one-recoverable NOTX SENDANDRECEIVE '.\private$\it' --payload string:1000 --count 3000 --delivery recoverable --receive-one
done
