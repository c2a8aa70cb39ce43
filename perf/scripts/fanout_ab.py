#!/usr/bin/env python3
"""1,000 consumers / 200 senders against one client, two builds alternated in one run
(docs/benchmarks.md, "1,000 consumers and 200 senders").

Each round runs, for each build (order alternating by round), the one-client command and then
the spread command (--queues 1000 --consumers 1000 --clients 200), and prints one line per
build, shape and op: msgs/s (median of the runs), the consumer min/max, CPU seconds of mqperf
(and of mqd when separate) and the load average before the run. At the end: per build and op
the medians and quartiles over rounds of msgs/s and of the spread/one ratio of the same round.

Usage: fanout_ab.py BASE_BIN_DIR NEW_BIN_DIR [--rounds N] [--separate] [--count N] [--runs N]
"""
import argparse, json, os, re, resource, shutil, statistics, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("base"); ap.add_argument("new")
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--separate", action="store_true", help="mqd in its own process, mqperf --broker")
ap.add_argument("--count", type=int, default=200000)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--only", choices=["one", "spread"], help="run only one shape")
a = ap.parse_args()

COMMON = ["NOTX", "SENDANDRECEIVE", r".\private$\perf", "--formatter", "raw", "--payload",
          "string:1000", "--count", str(a.count), "--runs", str(a.runs), "--delivery", "express",
          "--json"]
SPREAD = ["--queues", "1000", "--consumers", "1000", "--clients", "200"]

def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def run(bindir, shape):
    args = [f"{bindir}/mqperf"] + COMMON + (SPREAD if shape == "spread" else [])
    mqd = None
    if a.separate:
        d = tempfile.mkdtemp(prefix="fanout-ab-")
        mqd = subprocess.Popen([f"{bindir}/mqd", "--listen", "127.0.0.1:0", "--data-dir", d],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in mqd.stdout:
            m = re.search(r"listening on (\S+)", line)
            if m:
                url = "http://" + m.group(1)
                break
        args += ["--broker", url]
        mqd_cpu0 = cpu_of(mqd.pid)
    load = open("/proc/loadavg").read().split()[0]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    perf_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    mqd_cpu = None
    if mqd:
        mqd_cpu = cpu_of(mqd.pid) - mqd_cpu0
        mqd.kill(); mqd.wait()
        shutil.rmtree(d, ignore_errors=True)
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"mqperf failed: {args}")
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return {r["op"]: r for r in rows}, perf_cpu, mqd_cpu, load

res = {}  # (build, shape, op) -> [msgs/s per round]
ratio = {}  # (build, op) -> [ratio per round]
cpu = {}  # (build, shape, proc) -> [s]
shapes = [a.only] if a.only else ["one", "spread"]
for rnd in range(1, a.rounds + 1):
    order = [("base", a.base), ("new", a.new)]
    if rnd % 2 == 0:
        order.reverse()
    for name, bindir in order:
        got = {}
        for shape in shapes:
            rows, pc, mc, load = run(bindir, shape)
            got[shape] = rows
            cpu.setdefault((name, shape, "mqperf"), []).append(pc)
            if mc is not None:
                cpu.setdefault((name, shape, "mqd"), []).append(mc)
            for op, r in rows.items():
                res.setdefault((name, shape, op), []).append(r["msgs_per_s"])
                print(f"round {rnd} {name} {shape} {op} msgs/s {r['msgs_per_s']:.0f} "
                      f"per-consumer {r.get('consumer_min')}-{r.get('consumer_max')} "
                      f"mqperf_cpu {pc:.2f} mqd_cpu {mc if mc is None else round(mc, 2)} load {load}",
                      flush=True)
        if len(shapes) == 2:
            for op in got["one"]:
                ratio.setdefault((name, op), []).append(
                    got["spread"][op]["msgs_per_s"] / got["one"][op]["msgs_per_s"])

def q(xs):
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    qs = statistics.quantiles(xs, n=4, method="inclusive")
    return qs[0], statistics.median(xs), qs[2]

print("\nsummary (median, q1-q3 over rounds)")
for (name, shape, op), xs in sorted(res.items()):
    lo, med, hi = q(xs)
    print(f"{name:4} {shape:6} {op:7} {med:10.0f} ({lo:.0f}-{hi:.0f})")
for (name, op), xs in sorted(ratio.items()):
    lo, med, hi = q(xs)
    print(f"{name:4} ratio  {op:7} {med*100:5.1f}% ({lo*100:.1f}-{hi*100:.1f}%)")
for (name, shape, proc), xs in sorted(cpu.items()):
    lo, med, hi = q(xs)
    print(f"{name:4} {shape:6} cpu {proc:6} {med:6.2f} s ({lo:.2f}-{hi:.2f})")
