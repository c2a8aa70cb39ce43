#!/usr/bin/env python3
"""Summarizes perf/scripts/fanout_peers.sh output: per target and op, msgs/s of one client and
of the spread shape (median over rounds of each invocation's median), their ratio, and the
fewest / most messages one consumer got in the spread runs; then per target and shape the
CPU of the server and of mqperf over whole invocations (all runs and phases), as cores: CPU
seconds / wall seconds (2 = both vCPUs of the test machine).

Usage: perf/scripts/fanout_peers.py OUT.jsonl
"""
import collections, json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = collections.defaultdict(list)
cons = collections.defaultdict(list)
for r in rows:
    by[(r["target"], r["op"], r["shape"])].append(r["msgs_per_s"])
    if r["shape"] == "spread" and r.get("consumer_min") is not None:
        cons[(r["target"], r["op"])].append((r["consumer_min"], r["consumer_max"]))
print("| target | op | one client msg/s | spread msg/s | spread / one | per consumer (spread) |")
print("|---|---|---:|---:|---:|---|")
for t in ["mq", "rabbitmq", "nats"]:
    for op in ["send", "receive", "e2e"]:
        one, sp = by.get((t, op, "one")), by.get((t, op, "spread"))
        if not one or not sp:
            continue
        o, s = statistics.median(one), statistics.median(sp)
        c = cons.get((t, op))
        cc = f"{min(x[0] for x in c)}-{max(x[1] for x in c)}" if c else ""
        rng = lambda v: f"{min(v):,.0f}-{max(v):,.0f}" if len(v) > 1 else f"{v[0]:,.0f}"
        print(f"| {t} | {op} | {rng(one)} | {rng(sp)} | {100 * s / o:.0f}% | {cc} |")

cpu = collections.defaultdict(list)
seen = set()
for r in rows:
    key = (r["target"], r["shape"], r["round"])
    if "server_cpu_s" in r and key not in seen:
        seen.add(key)
        cpu[(r["target"], r["shape"])].append(r)
if cpu:
    print()
    print("| target | shape | server cores | mqperf cores | both |")
    print("|---|---|---:|---:|---:|")
    for t in ["mq", "rabbitmq", "nats"]:
        for shape in ["one", "spread"]:
            v = cpu.get((t, shape))
            if not v:
                continue
            sv = [x["server_cpu_s"] / x["wall_s"] for x in v]
            cl = [x["client_cpu_s"] / x["wall_s"] for x in v]
            bo = [a + b for a, b in zip(sv, cl)]
            f = lambda xs: "-".join(sorted({f"{min(xs):.2f}", f"{max(xs):.2f}"}))
            print(f"| {t} | {shape} | {f(sv)} | {f(cl)} | {f(bo)} |")
