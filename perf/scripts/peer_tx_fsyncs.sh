#!/usr/bin/env bash
# fsyncs RabbitMQ makes for one-at-a-time transactions (docs/benchmarks.md, "Synchronous
# transactions: the floor on this VM"): strace -c of beam.smp during mqperf TX SENDANDPURGE
# (send transactions) and TX SENDANDRECEIVE (sends, then receives: basic.get, basic.ack,
# tx.commit each), 2,000 messages, after a 200-message warm-up.
# Environment: BIN (mqperf, default target/release), COUNT=2000.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
COUNT=${COUNT:-2000}
. "$ROOT/perf/scripts/peer_servers.sh"
BEAM=$(pgrep -f beam.smp | head -1)
A=(--payload string:1000 --formatter raw --runs 1 --target amqp://guest:guest@127.0.0.1:5672)
for op in SENDANDPURGE SENDANDRECEIVE; do
  timeout 120 "$BIN/mqperf" TX $op '.\private$\rtx' "${A[@]}" --count 200 >/dev/null 2>&1
  strace -f -c -e trace=fsync,fdatasync,write -p "$BEAM" -o "$TMP/strace.txt" 2>/dev/null &
  SP=$!
  sleep 1
  timeout 300 "$BIN/mqperf" TX $op '.\private$\rtx' "${A[@]}" --count "$COUNT" 2>&1 | grep -E "raw +(send|receive|e2e) "
  sleep 0.5
  kill -INT $SP; wait $SP 2>/dev/null
  echo "== TX $op, $COUNT messages: beam.smp's syscalls"
  grep -E "calls|fsync|fdatasync|write" "$TMP/strace.txt"
done
