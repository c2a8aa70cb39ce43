#!/usr/bin/env python3
"""The side-by-side Markdown table of docs/benchmarks.md from mqperf --json reports.

Usage: perf/scripts/peers_table.py express.json recoverable.json tx.json
One line per (delivery, op, payload/formatter), one column per target (mq, rabbitmq, nats):
median msgs/s over the runs and, in brackets, min-max.
"""
import json
import sys


def short(x):
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


rows = []
for path in sys.argv[1:]:
    with open(path) as f:
        rows += [json.loads(line) for line in f if line.strip()]
targets = []
keys = []
cells = {}
for r in rows:
    if r["skipped"] or r["msgs_per_s"] is None:
        continue
    if r["target"] not in targets:
        targets.append(r["target"])
    k = (r["delivery"], r["op"], f'{r["payload"]}/{r["formatter"]}')
    if k not in keys:
        keys.append(k)
    cells[(k, r["target"])] = r
print("| delivery | op | payload/formatter | " + " | ".join(targets) + " |")
print("|---|---|---|" + "---:|" * len(targets))
for k in keys:
    out = []
    for t in targets:
        r = cells.get((k, t))
        out.append("-" if r is None else f'{short(r["msgs_per_s"])} ({short(r["msgs_per_s_min"])}–{short(r["msgs_per_s_max"])})')
    print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(out) + " |")
