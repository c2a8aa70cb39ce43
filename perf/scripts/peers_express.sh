#!/usr/bin/env bash
# The express 100 KB and 1 MB cells of issue 14's table with two mq builds side by side
# (docs/benchmarks.md, "Express sends into fresh memory"): a separate mqd of NEW_BIN_DIR
# (127.0.0.1:18011, started by peer_servers.sh with RabbitMQ and NATS JetStream), a separate
# mqd of BASE_BIN_DIR (127.0.0.1:18012), then RabbitMQ and NATS; one line per target and op.
# Usage: perf/scripts/peers_express.sh NEW_BIN_DIR BASE_BIN_DIR   Environment: ROUNDS=3
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:?usage: peers_express.sh NEW_BIN_DIR BASE_BIN_DIR}
BASE=${2:?usage: peers_express.sh NEW_BIN_DIR BASE_BIN_DIR}
ROUNDS=${ROUNDS:-3}
. "$ROOT/perf/scripts/peer_servers.sh"
mkdir -p "$TMP/mqb"
"$BASE/mqd" --listen 127.0.0.1:18012 --data-dir "$TMP/mqb" >"$TMP/mqdb.log" 2>&1 &
BPID=$!
trap 'kill -KILL $BPID; stop' EXIT
wait_port 18012 30
run() { # label bin-dir mqperf-args...
  local name=$1 bin=$2 out; shift 2
  for _ in 1 2 3 4 5; do out=$(timeout 600 "$bin/mqperf" "$@" --formatter raw --runs 1 --json 2>/dev/null) && break; sleep 3; done
  echo "$out" | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        print(sys.argv[1], r["target"][:5], r["op"], round(r["msgs_per_s"]), "load", open("/proc/loadavg").read().split()[0], flush=True)
' "$name"
}
for r in $(seq "$ROUNDS"); do
  for c in "100000 10000" "1000000 1000"; do
    set -- $c
    A=(NOTX SENDANDRECEIVE '.\private$\it' --payload "string:$1" --count "$2" --delivery express)
    echo "round $r payload $1"
    run new "$BIN" "${A[@]}" --target mq --broker http://127.0.0.1:18011
    run base "$BASE" "${A[@]}" --target mq --broker http://127.0.0.1:18012
    run peers "$BIN" "${A[@]}" --target amqp://guest:guest@127.0.0.1:5672 --target nats://127.0.0.1:4222
  done
done
