#!/usr/bin/env python3
"""Alternating A/B of two mqperf binaries (each with its embedded broker), 1000 B raw:
  BASE=DIR_A NEW=DIR_B perf/scripts/one_at_a_time_ab.py ROUNDS CELL...
where CELL is name:MODE:delivery:extra-flags, e.g.
  "tx:TX:x:--count 5000 --send-one --receive-one"
  "express:NOTX:express:--count 5000 --send-one --receive-one"
Prints per cell and op the msgs/s of each binary per round and the medians (docs/benchmarks.md,
"One message at a time")."""
import json, subprocess, sys, statistics, os
rounds = int(sys.argv[1])
cells = sys.argv[2:]
bins = {"base": os.environ["BASE"] + "/mqperf", "new": os.environ["NEW"] + "/mqperf"}
res = {}
for r in range(rounds):
    for cell in cells:
        name, mode, delivery, extra = cell.split(":", 3)
        order = list(bins.items()) if r % 2 == 0 else list(reversed(list(bins.items())))
        for b, path in order:
            q = r".\private$\ab" + name.replace("-", "")
            args = [path, mode, "SENDANDRECEIVE", q, "--payload", "string:1000", "--formatter", "raw",
                    "--runs", "1", "--json"] + extra.split()
            if mode == "NOTX":
                args += ["--delivery", delivery]
            out = subprocess.run(args, capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                print(name, b, "FAILED", out.stderr[-500:], flush=True)
                continue
            for line in out.stdout.splitlines():
                try:
                    row = json.loads(line)
                except Exception:
                    continue
                if "op" in row and row.get("msgs_per_s"):
                    res.setdefault((name, row["op"]), {}).setdefault(b, []).append(row["msgs_per_s"])
    print(f"round {r+1} done", file=sys.stderr, flush=True)
for (name, op), d in sorted(res.items()):
    base, new = d.get("base", []), d.get("new", [])
    mb = statistics.median(base) if base else 0
    mn = statistics.median(new) if new else 0
    print(f"{name:22} {op:8} base {' / '.join(f'{x:,.0f}' for x in base):40} new {' / '.join(f'{x:,.0f}' for x in new):40} median {mb:,.0f} -> {mn:,.0f} (x{mn/mb if mb else 0:.2f})")
