#!/usr/bin/env python3
"""Separate-mqd cells alternated in one run: synchronous transactions and the guards
(issue 14 point 3, branch txwake).

Each round runs every cell (an mqd binary with its extra flags) once, one after another (in
reverse order every other round), each
against a fresh mqd (data dir in --dir) with the same mqperf as the client, and prints the
mqperf rows with mqd's CPU seconds (user + system, from /proc) over the measured run and the
load average.

  --scenario tx      mqperf TX SENDANDRECEIVE --one-at-a-time --receive-and-commit --count N
  --scenario txpurge TX SENDANDPURGE --one-at-a-time --count N (send transactions only)
  --scenario trickle NOTX SENDANDPURGE --delivery recoverable --rate 500 and 3000 (4 s each):
                     lone commits 2 ms and 0.33 ms apart (the spin's CPU cost)
  --scenario guards  NOTX SENDANDRECEIVE --delivery recoverable, 1000 B (--count 100000) and
                     100 KB (--count 5000); TX SENDANDRECEIVE pipelined (--count 50000)

usage: txwake_ab.py --mqperf PATH --cell NAME=MQD[,FLAG...] --cell ... [--rounds 5]
  (a cell's FLAGs are mqd's, but mqperf=PATH: its own client; +FLAG: a flag of its mqperf)
                    [--count 2000] [--scenario tx|guards] [--dir /tmp]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROW = re.compile(r"^(\S+)\s+raw\s+(send|receive|e2e)\s+\d+\s+([\d,]+)\s+\S+\s+\S+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
TICK = os.sysconf("SC_CLK_TCK")


def load():
    return open("/proc/loadavg").read().split()[0]


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def run(args):
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"mqperf failed: {' '.join(args)}\n{out.stderr}")
    rows = []
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows.append((m.group(1), m.group(2), int(m.group(3).replace(",", "")),
                         m.group(4), m.group(5), m.group(6)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mqperf", required=True)
    ap.add_argument("--cell", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--scenario", default="tx", choices=["tx", "txpurge", "guards", "trickle"])
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    cells = []
    for c in a.cell:
        name, rest = c.split("=", 1)
        parts = rest.split(",")
        # In the flags, "mqperf=PATH" is the cell's client (else --mqperf) and "+FLAG" a flag
        # of its mqperf (e.g. +--current-thread); the others are mqd's.
        client = next((p[len("mqperf="):] for p in parts[1:] if p.startswith("mqperf=")),
                      a.mqperf)
        extra = [p[1:] for p in parts[1:] if p.startswith("+")]
        cells.append((name, parts[0], [p for p in parts[1:]
                                       if p and not p.startswith(("mqperf=", "+"))],
                      client, extra))
    if a.scenario == "tx":
        runs = [["TX", "SENDANDRECEIVE", ".\\private$\\txw", "--payload", "string:1000",
                 "--count", str(a.count), "--one-at-a-time", "--receive-and-commit"]]
    elif a.scenario == "txpurge":
        runs = [["TX", "SENDANDPURGE", ".\\private$\\txp", "--payload", "string:1000",
                 "--count", str(a.count), "--one-at-a-time"]]
    elif a.scenario == "trickle":
        runs = [["NOTX", "SENDANDPURGE", f".\\private$\\t{rate}", "--payload", "string:1000",
                 "--count", str(rate * 4), "--delivery", "recoverable", "--rate", str(rate)]
                for rate in (500, 3000)]
    else:
        runs = [["NOTX", "SENDANDRECEIVE", ".\\private$\\g1k", "--payload", "string:1000",
                 "--count", "100000", "--delivery", "recoverable"],
                ["NOTX", "SENDANDRECEIVE", ".\\private$\\g100k", "--payload", "string:100000",
                 "--count", "5000", "--delivery", "recoverable"],
                ["TX", "SENDANDRECEIVE", ".\\private$\\gtx", "--payload", "string:1000",
                 "--count", "50000"]]
    for r in range(1, a.rounds + 1):
        print(f"## round {r} {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load()}",
              flush=True)
        # Alternate the order (ABBA...) so that a load that rises through a round does not
        # always fall on the same cell.
        for name, mqd, flags, client, extra in (cells if r % 2 else cells[::-1]):
            data = tempfile.mkdtemp(dir=a.dir, prefix="txw-")
            p = subprocess.Popen([mqd, "--listen", "127.0.0.1:0", "--data-dir", data] + flags,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                url = "http://" + p.stdout.readline().strip().split()[-1]
                for args in runs:
                    base = [client] + args + extra + ["--formatter", "raw", "--runs", "1",
                                                      "--broker", url]
                    if a.scenario in ("tx", "txpurge"):
                        run(base[:base.index("--count") + 1] + ["300"]
                            + base[base.index("--count") + 2:])  # warm-up
                    c0, t0 = cpu(p.pid), time.monotonic()
                    rows = run(base)
                    c1, t1 = cpu(p.pid), time.monotonic()
                    cells_txt = " | ".join(f"{ph} {rate:>7}/s p50 {p50:>5} p99 {p99:>5}"
                                           for _, ph, rate, p50, p99, _ in rows)
                    what = args[4].split(':')[1] + (f" rate {args[-1]}" if "--rate" in args else "")
                    print(f"{name:<10} {args[0]} {what:>6} | {cells_txt} | "
                          f"mqd cpu {c1 - c0:5.2f} s of {t1 - t0:5.2f} s | load {load()}",
                          flush=True)
            finally:
                p.send_signal(signal.SIGKILL)
                p.wait()
                shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
