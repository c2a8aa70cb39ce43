#!/usr/bin/env bash
# The metrics cost check (issue 12, docs/benchmarks.md "Metrics cost"): mqperf NOTX
# SENDANDRECEIVE, 1000-byte bodies, recoverable and express, against a release mqd started
# without --metrics-listen ("off") and with it plus a scraper fetching /metrics every 100 ms
# ("on"), in alternated pairs in one run. A fresh mqd and data directory for every run.
#
# Usage (after `cargo build --release -p mq-broker -p mq-perf`):
#   perf/scripts/metrics_cost.sh
# Environment:
#   PAIRS=9            pairs per delivery (each pair: one off and one on run; the order
#                      alternates, off-on then on-off, so a drifting load hits both alike)
#   COUNT=20000        messages per mqperf run (--runs 1)
#   BIN=target/release where mqd and mqperf are
#   MQPERF=$BIN/mqperf the load generator (any recent release mqperf will do)
#   OUT=/tmp/mq-metrics-cost.jsonl   one JSON line per run
# Needs bash and python3. Every process is stopped by its PID; every wait is bounded.
# Prints, per cell (delivery x send/e2e): the medians off and on, their ratio, and the
# pairwise ratios on/off (median and quartiles); `uptime` before and after.

set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
PAIRS=${PAIRS:-9}
COUNT=${COUNT:-20000}
OUT=${OUT:-/tmp/mq-metrics-cost.jsonl}
MQPERF=${MQPERF:-$BIN/mqperf}
QUEUE='.\private$\perf'

for exe in "$BIN/mqd" "$MQPERF"; do
    [[ -x $exe ]] || { echo "metrics_cost: $exe not found; build --release first" >&2; exit 1; }
done

MQD=""
SCRAPER=""
DIR=""
cleanup() {
    [[ -n $SCRAPER ]] && kill "$SCRAPER" 2>/dev/null && wait "$SCRAPER" 2>/dev/null || true
    if [[ -n $MQD ]]; then
        kill -TERM "$MQD" 2>/dev/null || true
        for _ in $(seq 300); do kill -0 "$MQD" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$MQD" 2>/dev/null || true
        wait "$MQD" 2>/dev/null || true
    fi
    [[ -n $DIR ]] && rm -rf "$DIR"
    MQD="" SCRAPER="" DIR=""
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# run MODE DELIVERY PAIR: one mqperf run against a fresh mqd; appends a JSON line to $OUT.
run() {
    local mode=$1 delivery=$2 pair=$3
    DIR=$(mktemp -d "${TMPDIR:-/tmp}/mq-metrics-cost-XXXXXX")
    local extra=() hport=""
    if [[ $mode == on ]]; then
        hport=$(free_port)
        extra=(--metrics-listen "127.0.0.1:$hport")
    fi
    "$BIN/mqd" --listen 127.0.0.1:0 --data-dir "$DIR/data" "${extra[@]}" >"$DIR/out" 2>"$DIR/err" &
    MQD=$!
    local url=""
    for _ in $(seq 300); do
        url=$(sed -n 's/^listening on \(127\.0\.0\.1:[0-9]*\).*/http:\/\/\1/p' "$DIR/out" 2>/dev/null | head -1 || true)
        [[ -n $url ]] && break
        sleep 0.1
    done
    [[ -n $url ]] || { echo "metrics_cost: mqd did not start: $(cat "$DIR/err")" >&2; exit 1; }
    if [[ $mode == on ]]; then
        # At most 10 minutes of scraping; stopped by PID after the run. One process with one
        # kept-alive connection, as Prometheus scrapes: forking curl ten times a second would
        # cost the 2-core machine more CPU than the scrapes cost mqd.
        python3 - "$hport" "$DIR/scrapes" <<'PY' &
import http.client, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
conn = None
with open(out, "a") as f:
    for _ in range(6000):
        t = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            r.read()
            f.write(f"{r.status} {time.monotonic() - t:.6f}\n")
        except OSError:
            conn = None
        f.flush()
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t)))
PY
        SCRAPER=$!
    fi
    local load
    load=$(cut -d' ' -f1 /proc/loadavg)
    timeout 600 "$MQPERF" NOTX SENDANDRECEIVE "$QUEUE" --broker "$url" --delivery "$delivery" \
        --payload string:1000 --count "$COUNT" --runs 1 --json 2>/dev/null >"$DIR/perf"
    local scrapes=0
    if [[ -n $SCRAPER ]]; then
        kill "$SCRAPER" 2>/dev/null || true
        wait "$SCRAPER" 2>/dev/null || true
        SCRAPER=""
        scrapes=$(grep -c '^200 ' "$DIR/scrapes" || true)
    fi
    python3 - "$DIR/perf" "$mode" "$delivery" "$pair" "$load" "$scrapes" "$DIR/scrapes" >>"$OUT" <<'EOF'
import json, os, statistics, sys
path, mode, delivery, pair, load, scrapes, times = sys.argv[1:]
took = [float(l.split()[1]) for l in open(times) if l.startswith("200 ")] if os.path.exists(times) else []
scrape_ms = round(statistics.median(took) * 1000, 2) if took else None
for line in open(path):
    r = json.loads(line)
    if r.get("op") in ("send", "e2e"):
        print(json.dumps({"mode": mode, "delivery": delivery, "pair": int(pair), "load": float(load),
                          "scrapes": int(scrapes), "scrape_ms": scrape_ms, "op": r["op"], "msgs_per_s": r["msgs_per_s"]}))
EOF
    cleanup
}

: >"$OUT"
echo "uptime before: $(uptime)"
for pair in $(seq "$PAIRS"); do
    if ((pair % 2)); then order=(off on); else order=(on off); fi
    for delivery in recoverable express; do
        for mode in "${order[@]}"; do
            run "$mode" "$delivery" "$pair"
        done
    done
    echo "pair $pair/$PAIRS done ($(cut -d' ' -f1-3 /proc/loadavg))" >&2
done
echo "uptime after:  $(uptime)"

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def q(xs):
    xs = sorted(xs)
    qs = statistics.quantiles(xs, n=4, method="inclusive")
    return qs[0], qs[1], qs[2]
print(f"{'cell':<18} {'off median':>11} {'on median':>11} {'ratio':>7}   pairwise on/off: q1 / median / q3   (scrapes per on-run, load)")
for delivery in ("recoverable", "express"):
    for op in ("send", "e2e"):
        cell = [r for r in rows if r["delivery"] == delivery and r["op"] == op]
        off = {r["pair"]: r["msgs_per_s"] for r in cell if r["mode"] == "off"}
        on = {r["pair"]: r["msgs_per_s"] for r in cell if r["mode"] == "on"}
        pairs = sorted(set(off) & set(on))
        ratios = [on[p] / off[p] for p in pairs]
        q1, med, q3 = q(ratios)
        scrapes = [r["scrapes"] for r in cell if r["mode"] == "on"]
        took = [r["scrape_ms"] for r in cell if r["mode"] == "on" and r.get("scrape_ms") is not None]
        loads = [r["load"] for r in cell]
        print(f"{delivery + ' ' + op:<18} {statistics.median(off.values()):>11.0f} {statistics.median(on.values()):>11.0f} "
              f"{statistics.median(on.values()) / statistics.median(off.values()):>7.1%}   "
              f"{q1:.1%} / {med:.1%} / {q3:.1%}   (scrapes {min(scrapes)}-{max(scrapes)}, median scrape {statistics.median(took) if took else float('nan'):.2f} ms, load {min(loads):.1f}-{max(loads):.1f}, n={len(pairs)})")
EOF
