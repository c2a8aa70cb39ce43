#!/usr/bin/env bash
# Mixed load on one separate mqd (docs/benchmarks.md, "Commits written by the committing task"):
# a synchronous transaction client (TX SENDANDPURGE --one-at-a-time, 1000 B) runs in the
# background while a pipelined express client (NOTX SENDANDRECEIVE, 1000 B, --count 300000)
# runs; prints the express rates and the transactions committed a second during the express run
# (mq_transactions_committed_total from /metrics on 127.0.0.1:18990), and the inline commits.
# Usage: mixed_tx_express.sh MQPERF ROUNDS NAME=MQD[,MQD-FLAG...] ...   (cells alternate ABBA)
# TX_RATE=N: the transaction client runs open loop at N a second (mqperf --rate) instead of as
# fast as it can, so that every cell carries the same transaction load.
set -u
RATE=(); [ -n "${TX_RATE:-}" ] && RATE=(--rate "$TX_RATE")
MQPERF=$1; ROUNDS=$2; shift 2
for r in $(seq $ROUNDS); do
  cells=("$@"); [ $((r % 2)) -eq 0 ] && cells=($(printf '%s\n' "$@" | tac))
  for c in "${cells[@]}"; do
    name=${c%%=*}; bin=${c#*=}; bin=${bin%%,*}; flags=""; [[ "$c" == *,* ]] && flags=${c#*,}; flags=${flags//,/ }
    d=$(mktemp -d /tmp/mixed-XXXX)
    # mqd and both clients are stopped by their PIDs below.
    $bin --listen 127.0.0.1:0 --data-dir $d --metrics-listen 127.0.0.1:18990 $flags > $d/out 2>/dev/null & pid=$!
    for i in $(seq 100); do [ -s $d/out ] && break; sleep 0.05; done
    url="http://$(head -1 $d/out | awk '{print $NF}')"
    $MQPERF TX SENDANDPURGE '.\private$\warm' --payload string:1000 --count 300 --one-at-a-time --formatter raw --runs 1 --broker $url >/dev/null 2>&1
    $MQPERF TX SENDANDPURGE '.\private$\mtx' --payload string:1000 --count 200000 --one-at-a-time "${RATE[@]}" --formatter raw --runs 1 --broker $url > $d/tx 2>&1 & tpid=$!
    sleep 0.5
    c0=$(curl -s 127.0.0.1:18990/metrics | awk '/^mq_transactions_committed_total/{print $2}'); t0=$(date +%s.%N)
    $MQPERF NOTX SENDANDRECEIVE '.\private$\mex' --payload string:1000 --count 300000 --delivery express --formatter raw --runs 1 --broker $url > $d/ex 2>&1
    c1=$(curl -s 127.0.0.1:18990/metrics | awk '/^mq_transactions_committed_total/{print $2}'); t1=$(date +%s.%N)
    inl=$(curl -s 127.0.0.1:18990/metrics | awk '/^mq_journal_inline_commits_total/{print $2}')
    kill -INT $tpid 2>/dev/null; sleep 0.3; kill -9 $tpid 2>/dev/null; wait $tpid 2>/dev/null
    ex=$(grep -E "^\S+\s+raw\s+(send|receive|e2e)" $d/ex | awk '{printf "%s %s  ", $3, $5}')
    echo "round $r $name | express $ex| tx during it $(python3 -c "print(round(($c1-$c0)/($t1-$t0)))")/s inline ${inl:-0}"
    kill -9 $pid; wait $pid 2>/dev/null; rm -rf $d
  done
done
