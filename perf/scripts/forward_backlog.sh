#!/usr/bin/env bash
# The store-and-forward backlog test (docs/benchmarks.md, "Store-and-forward").
#
# Two real mqd processes on loopback: A (where the sender is connected) and B (where the queue
# lives). The queue is created on B, B is stopped, COUNT recoverable messages of BODY_BYTES bytes
# are sent to B's queue through A (they wait on disk in A's outgoing queue for B), A's RSS is
# recorded, B is started again on the same port, and A's RSS, A's backlog and B's queue are
# sampled (every POLL seconds, a line a second) until A's outgoing queue is empty. Then
# everything is received on B and counted.
#
# Usage (after `cargo build --release -p mq-broker -p mq-client`):
#   perf/scripts/forward_backlog.sh
# Environment:
#   COUNT=1000000       messages
#   BODY_BYTES=1000     body size
#   BIN=target/release  where mqd and mq are
#   RETRY_MAX=500ms     A's --forward-retry-max: A notices that B is back within this
#   POLL=0.25           seconds between looks at A's backlog while it drains (RSS peaks too;
#                       one line is printed per second)
#   SEND_TIMEOUT=1200   seconds the send may take; DRAIN_TIMEOUT=1800 the drain;
#                       RECEIVE_TIMEOUT=1200 the receive on B
#   KEEP=1              keep the data directories and logs (printed at the end)
# Needs bash, python3 (reads the JSON of `mq ... --json`), ps, timeout.
# Every wait is bounded; the mqd processes are stopped by PID on exit (trap).
# Exit status: 0 when all COUNT messages were received on B, else 1.

set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
COUNT=${COUNT:-1000000}
BODY_BYTES=${BODY_BYTES:-1000}
RETRY_MAX=${RETRY_MAX:-500ms}
POLL=${POLL:-0.25}
SEND_TIMEOUT=${SEND_TIMEOUT:-1200}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-1800}
RECEIVE_TIMEOUT=${RECEIVE_TIMEOUT:-1200}
QUEUE='.\private$\backlog'

for exe in "$BIN/mqd" "$BIN/mq"; do
    [[ -x $exe ]] || { echo "forward_backlog: $exe not found; run cargo build --release first" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "forward_backlog: python3 is needed" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mq-backlog-XXXXXX")
PID_A=""
PID_B=""

# Stops a process by PID: SIGTERM, up to 30 s, then SIGKILL.
stop_pid() {
    local pid=$1
    [[ -n $pid ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    echo "forward_backlog: pid $pid did not stop within 30 s; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    stop_pid "$PID_A"
    stop_pid "$PID_B"
    if [[ ${KEEP:-0} == 1 ]]; then
        echo "kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

die() {
    echo "forward_backlog: $*" >&2
    for n in a b; do
        [[ -s $WORK/$n.err ]] && { echo "--- mqd $n stderr (last lines):" >&2; tail -5 "$WORK/$n.err" >&2; }
    done
    exit 1
}

now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
rate() { python3 -c "import sys; print(f'{float(sys.argv[1]) / max(float(sys.argv[2]), 1e-9):,.0f}')" "$1" "$2"; }
rss_kib() { ps -o rss= -p "$1" 2>/dev/null | tr -d ' ' || echo 0; }
mib() { echo $(( ${1:-0} / 1024 )); }

# start_mqd NAME LISTEN: starts mqd with data dir $WORK/NAME and waits (30 s) for its
# "listening on" line; sets PID_A or PID_B, and PORT.
start_mqd() {
    local name=$1 listen=$2 out=$WORK/$1.out pid
    : >"$out"
    "$BIN/mqd" --listen "$listen" --data-dir "$WORK/$name" --name "backlog-$name" \
        --forward-retry-max "$RETRY_MAX" >"$out" 2>>"$WORK/$name.err" &
    pid=$!
    if [[ $name == a ]]; then PID_A=$pid; else PID_B=$pid; fi
    for _ in $(seq 300); do
        if grep -q '^listening on ' "$out"; then
            PORT=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out" | head -1)
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || die "mqd $name exited before listening"
        sleep 0.1
    done
    die "mqd $name did not print 'listening on' within 30 s"
}

# Messages in A's outgoing queue for B (0 if there is none).
outgoing_messages() {
    timeout 10 "$BIN/mq" --broker "$URL_A" outgoing list --json | python3 -c '
import json, sys
dest = sys.argv[1]
print(sum(q["messages"] for q in json.load(sys.stdin) if q["destination"] == dest))' "127.0.0.1:$PB" \
        || echo "?"
}

# Messages in B's queue ("-" while B cannot answer).
queue_messages() {
    timeout 10 "$BIN/mq" --broker "$URL_B" queue info "$QUEUE" --json 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["messages"])' 2>/dev/null || echo -
}

echo "forward_backlog: $COUNT recoverable messages of $BODY_BYTES bytes; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); work dir $WORK"

start_mqd a 127.0.0.1:0
PA=$PORT
start_mqd b 127.0.0.1:0
PB=$PORT
URL_A=http://127.0.0.1:$PA
URL_B=http://127.0.0.1:$PB
REMOTE="DIRECT=TCP:127.0.0.1:$PB\\private\$\\backlog"
echo "A $URL_A (pid $PID_A), B $URL_B (pid $PID_B); sending to $REMOTE through A"

timeout 30 "$BIN/mq" --broker "$URL_B" queue create "$QUEUE" >/dev/null
stop_pid "$PID_B"
PID_B=""
echo "B stopped"

RSS_A0=$(rss_kib "$PID_A")
BODY=$(head -c "$BODY_BYTES" /dev/zero | tr '\0' x)
T0=$(now)
timeout "$SEND_TIMEOUT" "$BIN/mq" --broker "$URL_A" send "$REMOTE" "$BODY" --count "$COUNT" --recoverable 2>&1 \
    || die "the send through A failed or took over $SEND_TIMEOUT s"
T1=$(now)
SEND_S=$(secs "$T0" "$T1")
WAITING=$(outgoing_messages)
[[ $WAITING == "$COUNT" ]] || die "A's outgoing queue holds $WAITING messages, expected $COUNT"
RSS_A1=$(rss_kib "$PID_A")
DISK_A=$(du -sm "$WORK/a" | cut -f1)
echo "sent $COUNT through A in $SEND_S s ($(rate "$COUNT" "$SEND_S") msg/s, each acknowledged once on A's disk)"
echo "backlog on A: $WAITING messages; A RSS $(mib "$RSS_A0") MiB before the sends, $(mib "$RSS_A1") MiB with the backlog; A data dir $DISK_A MiB"

start_mqd b "127.0.0.1:$PB"
[[ $PORT == "$PB" ]] || die "B came back on port $PORT, not $PB"
T2=$(now)
echo "B started again (pid $PID_B); A's backlog polled every ${POLL}s, a line every second"
printf '%8s %12s %12s %10s %10s\n' "t (s)" "A outgoing" "on B" "A RSS MiB" "B RSS MiB"
PEAK_A=$RSS_A1
PEAK_B=0
LAST_LINE=-1
while :; do
    T=$(now)
    EL=$(secs "$T2" "$T")
    LEFT=$(outgoing_messages)
    RA=$(rss_kib "$PID_A")
    RB=$(rss_kib "$PID_B")
    (( RA > PEAK_A )) && PEAK_A=$RA
    (( RB > PEAK_B )) && PEAK_B=$RB
    if [[ $LEFT == 0 || ${EL%.*} -gt $LAST_LINE ]]; then
        LAST_LINE=${EL%.*}
        printf '%8s %12s %12s %10s %10s\n' "$EL" "$LEFT" "$(queue_messages)" "$(mib "$RA")" "$(mib "$RB")"
    fi
    if [[ $LEFT == 0 ]]; then
        T3=$T
        break
    fi
    (( ${EL%.*} < DRAIN_TIMEOUT )) || die "A's backlog did not drain within $DRAIN_TIMEOUT s ($LEFT left)"
    sleep "$POLL"
done
DRAIN_S=$(secs "$T2" "$T3")
RSS_A2=$(rss_kib "$PID_A")
ON_B=$(queue_messages)
echo "drained: A's outgoing queue empty $DRAIN_S s after B was back ($(rate "$COUNT" "$DRAIN_S") msg/s; polled every ${POLL}s); $ON_B messages in B's queue"
echo "A RSS: peak $(mib "$PEAK_A") MiB while draining, $(mib "$RSS_A2") MiB after; B RSS peak $(mib "$PEAK_B") MiB"

T4=$(now)
GOT=$(timeout "$((RECEIVE_TIMEOUT + 30))" "$BIN/mq" --broker "$URL_B" receive "$QUEUE" --count "$COUNT" --timeout "${RECEIVE_TIMEOUT}s" | wc -l) || true
T5=$(now)
LEFT_B=$(queue_messages)
RECV_S=$(secs "$T4" "$T5")
echo "received on B: $GOT of $COUNT in $RECV_S s ($(rate "$GOT" "$RECV_S") msg/s); left in B's queue: $LEFT_B"
echo "SUMMARY count=$COUNT body_bytes=$BODY_BYTES send_s=$SEND_S a_rss_before_mib=$(mib "$RSS_A0") a_rss_backlog_mib=$(mib "$RSS_A1") a_disk_mib=$DISK_A drain_s=$DRAIN_S a_rss_peak_mib=$(mib "$PEAK_A") a_rss_after_mib=$(mib "$RSS_A2") b_rss_peak_mib=$(mib "$PEAK_B") received=$GOT receive_s=$RECV_S"
[[ $GOT == "$COUNT" && $LEFT_B == 0 ]] || die "received $GOT of $COUNT (left on B: $LEFT_B)"
echo "ok"
