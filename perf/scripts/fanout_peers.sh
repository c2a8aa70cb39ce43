#!/usr/bin/env bash
# The fan-out shape against mq and the peers (docs/benchmarks.md, "Fan-out, side by side"):
# for each target, one client on one queue, then 200 senders, 1,000 queues and 1,000 consumers
# (--clients 200 --queues 1000 --consumers 1000), NOTX SENDANDRECEIVE 1000 B raw, delivery
# DELIVERY (express), --count COUNT --runs RUNS; ROUNDS rounds. mq runs against a separate mqd (127.0.0.1:18011);
# RabbitMQ and NATS as perf/scripts/peer_servers.sh starts them. Prints one JSON row per op
# and invocation (with "shape", "round", and the invocation's "server_cpu_s", "client_cpu_s"
# and "wall_s" added) to stdout; summarize with perf/scripts/fanout_peers.py.
#
# Usage: BIN=target/release [ROUNDS=2] [COUNT=200000] [RUNS=3] [DELIVERY=express|recoverable] \
#   perf/scripts/fanout_peers.sh > OUT.jsonl
set -uo pipefail
BIN=${BIN:?set BIN to the directory of mqd and mqperf}
ROUNDS=${ROUNDS:-2} COUNT=${COUNT:-200000} RUNS=${RUNS:-3} DELIVERY=${DELIVERY:-express}
source "$(dirname "$0")/peer_servers.sh"
TARGETS=("mq" "amqp://guest:guest@127.0.0.1:5672" "nats://127.0.0.1:4222")
# The server process of each target (RabbitMQ's Erlang VM is a child of its start script).
BEAM_PID=$(pgrep -f "beam.smp.*$TMP" | head -1)
server_pid() { case $1 in mq) echo "$MQD_PID" ;; amqp*) echo "$BEAM_PID" ;; *) echo "$NATS_PID" ;; esac; }
# CPU seconds (user + system) a process has used so far.
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }
for round in $(seq "$ROUNDS"); do
  for t in "${TARGETS[@]}"; do
    for shape in one spread; do
      args=(NOTX SENDANDRECEIVE '.\private$\fan' --formatter raw --payload string:1000
            --count "$COUNT" --runs "$RUNS" --delivery "$DELIVERY" --json --target "$t")
      [ "$t" = mq ] && args+=(--broker http://127.0.0.1:18011)
      [ "$shape" = spread ] && args+=(--clients 200 --queues 1000 --consumers 1000)
      echo "round $round $shape $t" >&2
      spid=$(server_pid "$t"); s0=$(cpu_s "$spid"); w0=$(date +%s.%N)
      # mqperf's own CPU (user + system) goes to $TMP/client_cpu.
      /usr/bin/time -f "%U %S" -o "$TMP/client_cpu" timeout 1800 "$BIN/mqperf" "${args[@]}" \
        >"$TMP/rows.jsonl" 2>>"$TMP/err.log" \
        || { echo "mqperf failed: ${args[*]}" >&2; tail -5 "$TMP/err.log" >&2; }
      s1=$(cpu_s "$spid"); w1=$(date +%s.%N)
      python3 -c "
import json, sys
u, s = open('$TMP/client_cpu').read().split()[-2:]
for l in open('$TMP/rows.jsonl'):
    if l.startswith('{'):
        r = json.loads(l); r['shape'] = '$shape'; r['round'] = $round
        # The whole invocation (all runs and phases): server and mqperf CPU seconds, wall time.
        r['server_cpu_s'] = round($s1 - $s0, 2); r['client_cpu_s'] = round(float(u) + float(s), 2)
        r['wall_s'] = round($w1 - $w0, 2); print(json.dumps(r))"
    done
  done
done
