# Sourced by disk_peers.sh and issue_table.sh (needs BIN): starts RabbitMQ (127.0.0.1:5672),
# NATS JetStream (127.0.0.1:4222) and a separate mqd (127.0.0.1:18011) with their data in a
# temporary directory, waits until all three listen, and stops each by its PID on exit.
# Sets TMP, RABBIT_PID, NATS_PID, MQD_PID.
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
