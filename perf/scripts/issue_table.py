#!/usr/bin/env python3
"""Issue 14's table from perf/scripts/issue_table.sh's output (JSON rows with a "cell" field).

Usage: perf/scripts/issue_table.py OUT.jsonl
One line per (cell, op): each target's msgs/s in every round, and mq over the best peer
(the range over rounds, each round's mq against that round's best peer).
"""
import json
import sys
from collections import defaultdict

vals = defaultdict(lambda: defaultdict(list))  # (cell, op) -> target -> [msgs/s per round]
order = []
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r.get("skipped") or r.get("msgs_per_s") is None:
        continue
    key = (r["cell"], r["op"])
    if key not in order:
        order.append(key)
    t = r["target"]
    t = "mq" if t == "mq" else ("rabbitmq" if t.startswith("amqp") else ("nats" if t.startswith("nats") else t))
    vals[key][t].append(r["msgs_per_s"])


def fmt(xs):
    return " / ".join(f"{x:,.0f}" for x in xs) if xs else "–"


print("| cell | op | mq | RabbitMQ | NATS | mq / best peer |")
print("|---|---|---:|---:|---:|---:|")
for key in order:
    v = vals[key]
    mq, rb, na = v.get("mq", []), v.get("rabbitmq", []), v.get("nats", [])
    ratios = []
    for i, m in enumerate(mq):
        peers = [p[i] for p in (rb, na) if i < len(p)]
        if peers:
            ratios.append(m / max(peers))
    ratio = f"×{min(ratios):.2f}–{max(ratios):.2f}" if ratios else "–"
    print(f"| {key[0]} | {key[1]} | {fmt(mq)} | {fmt(rb)} | {fmt(na)} | {ratio} |")
