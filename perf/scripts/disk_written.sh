#!/usr/bin/env bash
# Bytes each broker writes to its disk during one mqperf invocation per target
# (docs/benchmarks.md, "Disk bandwidth, and who writes what"): write_bytes of /proc/PID/io of
# mqd, beam.smp (RabbitMQ) and nats-server before and after, and their CPU ticks.
# Usage: perf/scripts/disk_written.sh [MQPERF-ARGS...]
#   default: NOTX SENDANDRECEIVE 1 MB recoverable, --count 1000 --runs 1; 2 rounds (ROUNDS).
# Environment: BIN (mqd and mqperf, default target/release), ROUNDS=2.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
ROUNDS=${ROUNDS:-2}
ARGS=("$@")
((${#ARGS[@]})) || ARGS=(NOTX SENDANDRECEIVE '.\private$\db' --payload string:1000000 --count 1000 --delivery recoverable)
. "$ROOT/perf/scripts/peer_servers.sh"
BEAM=$(pgrep -f beam.smp | head -1)
wb() { awk '/^write_bytes/{print $2}' "/proc/$1/io"; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for round in $(seq "$ROUNDS"); do
  for t in mq rabbitmq nats; do
    case $t in
      mq) pid=$MQD_PID; tgt=(--target mq --broker http://127.0.0.1:18011) ;;
      rabbitmq) pid=$BEAM; tgt=(--target amqp://guest:guest@127.0.0.1:5672) ;;
      nats) pid=$NATS_PID; tgt=(--target nats://127.0.0.1:4222) ;;
    esac
    b0=$(wb "$pid"); c0=$(ticks "$pid")
    out=$(timeout 600 "$BIN/mqperf" "${ARGS[@]}" --formatter raw --runs 1 "${tgt[@]}" 2>&1 |
      grep -E "raw +(send|receive|e2e) " | awk '{print $3, $5}' | tr '\n' ' ')
    b1=$(wb "$pid"); c1=$(ticks "$pid")
    echo "round $round $t: $out| wrote $(((b1 - b0) / 1048576)) MiB, cpu $((c1 - c0)) ticks"
  done
done
