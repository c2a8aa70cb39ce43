#!/usr/bin/env bash
# Express burst against a fresh separate mqd (docs/benchmarks.md, "A body left behind by its
# batch"): mqperf sends then receives 800,000 x 1000 B; prints msg/s per phase, mqd's RSS at
# the start, its peak (VmHWM) and its RSS 1-5 s and 10 s after the run. mqd is killed by PID.
# Usage: perf/scripts/burst_rss.sh BIN_DIR PORT   (BIN_DIR holds mqd and mqperf)
set -u
bin=${1:?usage: burst_rss.sh BIN_DIR PORT}
port=${2:?usage: burst_rss.sh BIN_DIR PORT}
dir=$(mktemp -d /tmp/burst.XXXXXX)
"$bin/mqd" --listen 127.0.0.1:$port --data-dir "$dir" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
start=$(awk '/VmRSS/{print int($2/1024)}' /proc/$pid/status)
"$bin/mqperf" NOTX SENDANDRECEIVE '.\private$\burst' --payload string:1000 --count 800000 --runs 1 --formatter raw --broker http://127.0.0.1:$port --json 2>/dev/null | python3 -c "
import sys,json
for l in sys.stdin:
  r=json.loads(l); print(r['op'], round(r['msgs_per_s']))" | tr '\n' ' '
hwm=$(awk '/VmHWM/{print int($2/1024)}' /proc/$pid/status)
s=""
for t in 1 2 3 4 5 10; do sleep $([ $t = 10 ] && echo 5 || echo 1); s="$s ${t}s=$(awk '/VmRSS/{print int($2/1024)}' /proc/$pid/status)"; done
echo "| start $start MiB peak $hwm MiB after:$s"
kill -9 $pid; wait $pid 2>/dev/null; rm -rf "$dir"
