#!/usr/bin/env bash
# How many bytes each broker writes to disk, and how many fsync-family calls it makes, while
# mqperf runs against it (docs/benchmarks.md, "Writeback started while the batch is written").
# mq (a separate mqd), RabbitMQ and NATS JetStream in turn, all on 127.0.0.1; write_bytes from
# /proc/PID/io, syscalls counted with `perf stat -e syscalls:sys_enter_f(data)sync -p PID`.
# Usage (after `cargo build --release -p mq-broker -p mq-perf`; root for perf and /proc):
#   perf/scripts/disk_peers.sh
# Environment: BIN, COUNT=1000, PAYLOAD=string:1000000, ROUNDS=2, DELIVERY=recoverable.
# Per round and broker: SENDANDPURGE (send phase only), then SENDANDRECEIVE (send, receive, e2e).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
COUNT=${COUNT:-1000}
PAYLOAD=${PAYLOAD:-string:1000000}
ROUNDS=${ROUNDS:-2}
. "$ROOT/perf/scripts/peer_servers.sh"
BEAM=$(pgrep -f beam.smp | head -1)
wb() { awk '/^write_bytes/{print $2}' /proc/$1/io; }
measure() { # name pid mode target-args...
  local name=$1 pid=$2 mode=$3; shift 3
  local w0; w0=$(wb $pid)
  perf stat -e 'syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync' -p $pid -o $TMP/stat.$name & local sp=$!
  sleep 0.5
  local out; for a in 1 2 3 4 5; do out=$(timeout 300 $BIN/mqperf NOTX $mode '.\private$\dp' --payload $PAYLOAD --formatter raw --count $COUNT --runs 1 --delivery ${DELIVERY:-recoverable} --json "$@" 2>$TMP/err) && break; sleep 3; done
  sleep 1
  kill -INT $sp; wait $sp 2>/dev/null
  local w1; w1=$(wb $pid)
  local syncs; syncs=$(awk '/sys_enter_f/{gsub(",","",$1); s+=$1} END{print s}' $TMP/stat.$name)
  echo "$out" | python3 -c "
import json,sys
ops={}
for l in sys.stdin:
    l=l.strip()
    if not l.startswith('{'): continue
    r=json.loads(l); ops[r['op']]=round(r['msgs_per_s'])
print('$name $mode', ops, 'disk_written_MB', round(($w1-$w0)/1e6), 'syncs', '$syncs', flush=True)
"
}
for r in $(seq $ROUNDS); do
  for mode in SENDANDPURGE SENDANDRECEIVE; do
    measure mq $MQD_PID $mode --target mq --broker http://127.0.0.1:18011
    measure rabbitmq $BEAM $mode --target amqp://guest:guest@127.0.0.1:5672
    measure nats $NATS_PID $mode --target nats://127.0.0.1:4222
  done
done
