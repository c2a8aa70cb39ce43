#!/usr/bin/env bash
# Express sends into a fresh separate mqd (docs/benchmarks.md, "Express sends into fresh
# memory"): mqperf NOTX SENDANDPURGE, with `perf stat -e page-faults,task-clock` on the mqd
# for the whole invocation; prints the send's median/min/max msg/s, mqd's peak RSS (VmHWM),
# its page faults and CPU. mqd is stopped by its PID.
# Usage: perf/scripts/fresh_send.sh BIN_DIR PAYLOAD_BYTES COUNT RUNS   (e.g. ... 100000 10000 1)
# Environment: PORT=18099. Needs perf.
set -u
BIN=${1:?usage: fresh_send.sh BIN_DIR PAYLOAD_BYTES COUNT RUNS}
P=${2:?payload bytes}; C=${3:?count}; R=${4:?runs}
PORT=${PORT:-18099}
D=$(mktemp -d /tmp/fresh-send.XXXXXX)
"$BIN/mqd" --listen 127.0.0.1:$PORT --data-dir "$D/data" >"$D/mqd.log" 2>&1 &
M=$!
for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
perf stat -e page-faults,task-clock -p $M -o "$D/stat.txt" &
S=$!
sleep 0.3
"$BIN/mqperf" NOTX SENDANDPURGE '.\private$\fr' --payload "string:$P" --count "$C" --delivery express \
  --formatter raw --runs "$R" --broker "http://127.0.0.1:$PORT" --json 2>/dev/null |
  python3 -c '
import json, sys
p = int(sys.argv[1])
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        if r.get("op") == "send":
            print("send median", round(r["msgs_per_s"]), "min", round(r["msgs_per_s_min"]), "max",
                  round(r["msgs_per_s_max"]), "msg/s;", round(r["msgs_per_s"] * p / 1e9, 2), "GB/s")
' "$P"
grep VmHWM "/proc/$M/status"
kill -INT $S; wait $S 2>/dev/null
kill $M; wait $M 2>/dev/null
grep -E "page-faults|task-clock" "$D/stat.txt"
rm -rf "$D"
