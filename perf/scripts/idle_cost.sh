#!/usr/bin/env bash
# The idle cost of many queues (issue 14, issue 12 point 6; docs/benchmarks.md "An idle mqd
# with 100,000 queues"): two mqd builds, BEFORE and AFTER, each started in alternated runs on a
# copy of one data directory holding QUEUES queues (made once by mqperf NOTX SENDANDPURGE
# --queues QUEUES --count QUEUES --keep --delivery recoverable: one message in each), then left
# idle. Per run: mqd's CPU over IDLE seconds (utime + stime from /proc/PID/stat), and the time
# each tick of the counters' saving task took (its trace line, RUST_LOG=...counters_store=trace;
# an mqd older than the commit that added that line reports no tick times).
#
# Usage (after `cargo build --release -p mq-broker -p mq-perf`, with a copy of the older mqd):
#   BEFORE=/tmp/mqd-before perf/scripts/idle_cost.sh
# Environment:
#   BEFORE             the mqd to compare against (required)
#   AFTER=$BIN/mqd     the mqd under test
#   BIN=target/release where mqperf (and by default mqd) are
#   QUEUES=100000      queues in the data directory
#   IDLE=30            seconds of idle measured per run
#   SETTLE=10          seconds after start-up before measuring (the first snapshot is written)
#   PAIRS=3            before/after pairs; the order alternates (before-after, after-before)
#   OUT=/tmp/mq-idle-cost.jsonl   one JSON line per run
# Needs bash, python3. Every process is stopped by its PID; every wait is bounded.

set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
BEFORE=${BEFORE:?set BEFORE to the older mqd}
AFTER=${AFTER:-$BIN/mqd}
QUEUES=${QUEUES:-100000}
IDLE=${IDLE:-30}
SETTLE=${SETTLE:-10}
PAIRS=${PAIRS:-3}
OUT=${OUT:-/tmp/mq-idle-cost.jsonl}
MQPERF=${MQPERF:-$BIN/mqperf}

for exe in "$BEFORE" "$AFTER" "$MQPERF"; do
    [[ -x $exe ]] || { echo "idle_cost: $exe not found" >&2; exit 1; }
done

MQD=""
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mq-idle-cost-XXXXXX")
stop() {
    if [[ -n $MQD ]]; then
        kill -TERM "$MQD" 2>/dev/null || true
        for _ in $(seq 600); do kill -0 "$MQD" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$MQD" 2>/dev/null || true
        wait "$MQD" 2>/dev/null || true
    fi
    MQD=""
}
cleanup() { stop; rm -rf "$WORK"; }
trap cleanup EXIT

# start EXE DATA LOG: starts mqd, sets MQD and URL.
start() {
    local exe=$1 data=$2 log=$3
    RUST_LOG=info,mq_broker::counters_store=trace "$exe" --listen 127.0.0.1:0 --data-dir "$data" \
        >"$log.out" 2>"$log.err" &
    MQD=$!
    URL=""
    for _ in $(seq 1200); do
        URL=$(sed -n 's/^listening on \(127\.0\.0\.1:[0-9]*\).*/http:\/\/\1/p' "$log.out" 2>/dev/null | head -1 || true)
        [[ -n $URL ]] && break
        kill -0 "$MQD" 2>/dev/null || break
        sleep 0.1
    done
    [[ -n $URL ]] || { echo "idle_cost: mqd did not start: $(tail -5 "$log.err")" >&2; exit 1; }
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

echo "uptime before: $(uptime)"
echo "making $QUEUES queues with $AFTER ..." >&2
start "$AFTER" "$WORK/seed" "$WORK/seed"
t0=$(date +%s)
timeout 1800 "$MQPERF" NOTX SENDANDPURGE '.\private$\idle' --broker "$URL" --queues "$QUEUES" \
    --count "$QUEUES" --keep --delivery recoverable --runs 1 >"$WORK/seed.perf" 2>&1 \
    || { echo "idle_cost: mqperf failed: $(tail -5 "$WORK/seed.perf")" >&2; exit 1; }
echo "queues made in $(( $(date +%s) - t0 )) s" >&2
stop

: >"$OUT"
hz=$(getconf CLK_TCK)
for pair in $(seq "$PAIRS"); do
    if ((pair % 2)); then order=(before after); else order=(after before); fi
    for which in "${order[@]}"; do
        exe=$BEFORE
        [[ $which == after ]] && exe=$AFTER
        rm -rf "$WORK/run"
        cp -a "$WORK/seed" "$WORK/run"
        log="$WORK/run-$which-$pair"
        start "$exe" "$WORK/run" "$log"
        sleep "$SETTLE"
        load=$(cut -d' ' -f1 /proc/loadavg)
        mark=$(wc -l <"$log.err")
        c0=$(cpu_ticks "$MQD")
        sleep "$IDLE"
        c1=$(cpu_ticks "$MQD")
        tail -n +"$((mark + 1))" "$log.err" >"$log.idle"
        stop
        python3 - "$log.idle" "$which" "$pair" "$load" "$c0" "$c1" "$hz" "$IDLE" >>"$OUT" <<'EOF'
import json, re, statistics, sys
path, which, pair, load, c0, c1, hz, idle = sys.argv[1:]
us = []
for line in open(path, errors="replace"):
    if "counters tick" in line:
        m = re.search(r"micros=(\d+)", line)
        if m:
            us.append(int(m.group(1)))
cpu = (int(c1) - int(c0)) / int(hz)
print(json.dumps({"which": which, "pair": int(pair), "load": float(load),
                  "cpu_s": cpu, "cpu_pct": 100 * cpu / float(idle), "ticks": len(us),
                  "tick_us_median": statistics.median(us) if us else None,
                  "tick_us_max": max(us) if us else None}))
EOF
        tail -1 "$OUT" >&2
    done
done
echo "uptime after:  $(uptime)"

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'mqd':<7} {'CPU % idle (median, min-max)':>30} {'tick us (median of medians)':>28} {'ticks/run':>10}  loads")
for which in ("before", "after"):
    r = [x for x in rows if x["which"] == which]
    cpu = [x["cpu_pct"] for x in r]
    tick = [x["tick_us_median"] for x in r if x["tick_us_median"] is not None]
    print(f"{which:<7} {statistics.median(cpu):>14.2f} ({min(cpu):.2f}-{max(cpu):.2f}){'':>8} "
          f"{(statistics.median(tick) if tick else float('nan')):>28.0f} {statistics.median([x['ticks'] for x in r]):>10}  "
          f"{min(x['load'] for x in r):.1f}-{max(x['load'] for x in r):.1f}")
EOF
