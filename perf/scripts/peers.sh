#!/usr/bin/env bash
# mq, RabbitMQ and NATS JetStream side by side (docs/benchmarks.md, "mq and its peers").
#
# Starts rabbitmq-server and nats-server (Debian packages rabbitmq-server and nats-server),
# both bound to 127.0.0.1, data and logs in a temporary directory; runs mqperf against mq
# (embedded), RabbitMQ and NATS in three modes (NOTX express, NOTX recoverable, TX), each
# invocation with --json and --csv; draws the figures with `mqperf plot`; stops every server
# by PID (RabbitMQ by its process group, then `epmd -kill`) on exit, and removes the temp dir.
#
# Usage (after `cargo build --release -p mq-perf`):
#   perf/scripts/peers.sh OUT_DIR
# Environment:
#   BIN=target/release   where mqperf is
#   COUNT=5000 RUNS=3    NOTX messages per run and runs
#   TX_COUNT=200         TX messages per run (RabbitMQ commits, and fsyncs, once per message)
#   PAYLOADS=empty,string:1000  FORMATTERS=raw,binary
#   AMQP_PORT=5672 NATS_PORT=4222 EPMD_PORT=4369 DIST_PORT=25672
# Writes OUT_DIR/{express,recoverable,tx}.{json,csv,txt} and OUT_DIR/peers.svg, peers.png.
# Every wait is bounded. Exit status: 0 when every run passed.

set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
OUT=${1:?usage: perf/scripts/peers.sh OUT_DIR}
COUNT=${COUNT:-5000}
RUNS=${RUNS:-3}
TX_COUNT=${TX_COUNT:-200}
PAYLOADS=${PAYLOADS:-empty,string:1000}
FORMATTERS=${FORMATTERS:-raw,binary}
AMQP_PORT=${AMQP_PORT:-5672}
NATS_PORT=${NATS_PORT:-4222}
EPMD_PORT=${EPMD_PORT:-4369}
DIST_PORT=${DIST_PORT:-25672}
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/mqperf-peers.XXXXXX)
RABBIT_PID=
NATS_PID=

stop() {
  if [ -n "$NATS_PID" ]; then kill -TERM "$NATS_PID" 2>/dev/null || true; fi
  if [ -n "$RABBIT_PID" ]; then
    kill -TERM -- "-$RABBIT_PID" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$RABBIT_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$RABBIT_PID" 2>/dev/null || true
    ERL_EPMD_PORT=$EPMD_PORT epmd -kill >/dev/null 2>&1 || true
  fi
  if [ -n "$NATS_PID" ]; then
    for _ in $(seq 1 50); do kill -0 "$NATS_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$NATS_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap stop EXIT

wait_port() { # port seconds
  for _ in $(seq 1 $(($2 * 5))); do
    if (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "nothing listens on 127.0.0.1:$1 after $2 s" >&2
  return 1
}

echo "[]." >"$TMP/enabled_plugins"
(
  cd "$TMP"
  export HOME=$TMP RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$AMQP_PORT \
    RABBITMQ_DIST_PORT=$DIST_PORT ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}' \
    RABBITMQ_NODENAME=mqperf@localhost RABBITMQ_MNESIA_BASE=$TMP/mnesia RABBITMQ_LOG_BASE=$TMP/log \
    RABBITMQ_ENABLED_PLUGINS_FILE=$TMP/enabled_plugins RABBITMQ_CONFIG_FILE=$TMP/rabbitmq \
    RABBITMQ_ADVANCED_CONFIG_FILE=$TMP/advanced.config RABBITMQ_CONF_ENV_FILE=$TMP/rabbitmq-env.conf
  exec setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$TMP/rabbitmq.log" 2>&1
) &
RABBIT_PID=$!
nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$TMP/nats" >"$TMP/nats.log" 2>&1 &
NATS_PID=$!
wait_port "$NATS_PORT" 30
wait_port "$AMQP_PORT" 180
RABBIT_VERSION=$(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo unknown)
echo "rabbitmq-server $RABBIT_VERSION (pid $RABBIT_PID), nats-server $(nats-server --version) (pid $NATS_PID)"

TARGETS=(--target mq --target "amqp://guest:guest@127.0.0.1:$AMQP_PORT" --target "nats://127.0.0.1:$NATS_PORT")
run() { # name mode count [args]
  local name=$1 mode=$2 count=$3
  shift 3
  # RabbitMQ may accept TCP a moment before it accepts logins: retry the first run briefly.
  for attempt in 1 2 3 4 5 6; do
    if "$BIN/mqperf" "$mode" SENDANDRECEIVE '.\private$\peers' --payload "$PAYLOADS" --formatter "$FORMATTERS" \
      --count "$count" --runs "$RUNS" "${TARGETS[@]}" --json --csv "$OUT/$name.csv" "$@" \
      >"$OUT/$name.json" 2>"$OUT/$name.txt"; then
      return 0
    fi
    grep -q "cannot connect" "$OUT/$name.txt" || break
    sleep 5
  done
  cat "$OUT/$name.txt" >&2
  return 1
}
run express NOTX "$COUNT" --delivery express
run recoverable NOTX "$COUNT" --delivery recoverable
run tx TX "$TX_COUNT"
CAPTION="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') | mq $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), RabbitMQ $RABBIT_VERSION, NATS $(nats-server --version | awk '{print $2}') | perf/scripts/peers.sh (COUNT=$COUNT TX_COUNT=$TX_COUNT RUNS=$RUNS)"
for f in svg png; do
  "$BIN/mqperf" plot "$OUT/express.json" "$OUT/recoverable.json" "$OUT/tx.json" --out "$OUT/peers.$f" --caption "$CAPTION"
done
echo "wrote $OUT"
