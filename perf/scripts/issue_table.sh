#!/usr/bin/env bash
# The cells of issue 14's table, mq (a separate mqd) against RabbitMQ and NATS JetStream, each
# cell one mqperf invocation with the three targets one after another
# (docs/benchmarks.md, "The issue's table again").
# Usage (after `cargo build --release -p mq-broker -p mq-perf`):
#   perf/scripts/issue_table.sh > OUT.jsonl   (JSON rows of mqperf, each with a "cell" field)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
ROUNDS=${ROUNDS:-2}
TMP=$(mktemp -d /tmp/dpeer-run.XXXXXX)
RABBIT_PID= NATS_PID= MQD_PID=
stop() {
  [ -n "$MQD_PID" ] && kill -KILL $MQD_PID 2>/dev/null
  [ -n "$NATS_PID" ] && kill -TERM $NATS_PID 2>/dev/null
  if [ -n "$RABBIT_PID" ]; then kill -TERM -- "-$RABBIT_PID" 2>/dev/null; for _ in $(seq 150); do kill -0 $RABBIT_PID 2>/dev/null || break; sleep 0.2; done; kill -KILL -- "-$RABBIT_PID" 2>/dev/null; ERL_EPMD_PORT=4369 epmd -kill >/dev/null 2>&1; fi
  sleep 1; rm -rf "$TMP"
}
trap stop EXIT
wait_port() { for _ in $(seq 1 $(($2 * 5))); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.2; done; return 1; }
echo "[]." >"$TMP/enabled_plugins"
( cd "$TMP"; export HOME=$TMP RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=5672 RABBITMQ_DIST_PORT=25672 ERL_EPMD_PORT=4369 ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}' RABBITMQ_NODENAME=mqperf@localhost RABBITMQ_MNESIA_BASE=$TMP/mnesia RABBITMQ_LOG_BASE=$TMP/log \
    RABBITMQ_ENABLED_PLUGINS_FILE=$TMP/enabled_plugins RABBITMQ_CONFIG_FILE=$TMP/rabbitmq RABBITMQ_ADVANCED_CONFIG_FILE=$TMP/advanced.config RABBITMQ_CONF_ENV_FILE=$TMP/rabbitmq-env.conf
  exec setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$TMP/rabbitmq.log" 2>&1 ) &
RABBIT_PID=$!
nats-server -a 127.0.0.1 -p 4222 -js -sd "$TMP/nats" >"$TMP/nats.log" 2>&1 &
NATS_PID=$!
mkdir -p $TMP/mq; $BIN/mqd --listen 127.0.0.1:18011 --data-dir $TMP/mq >$TMP/mqd.log 2>&1 &
MQD_PID=$!
wait_port 4222 30; wait_port 18011 30; wait_port 5672 180 || { echo no rabbit; exit 1; }
sleep 3
# Environment: BIN, ROUNDS=2.
T=(--target mq --broker http://127.0.0.1:18011 --target amqp://guest:guest@127.0.0.1:5672 --target nats://127.0.0.1:4222)
cell() { # name mqperf-args... (TARGETS: the --target list, all three unless set)
  local name=$1; shift
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
done
