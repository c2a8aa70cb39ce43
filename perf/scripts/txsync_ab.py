#!/usr/bin/env python3
"""Synchronous transactions, before/after, alternated in one run (issue 14 point 3).

Each round runs, one after another, in the same minute:
  - the floor probe (perf/examples/txfloor.rs): fdatasync of 1,137 B into fallocated and into
    zeroed space, TCP and gRPC ping-pong between two processes;
  - mqperf TX one-at-a-time send and receive_and_commit, embedded broker, both builds;
  - the same through a separate mqd of each build (fresh data dir in --dir), with the new and the
    old mqperf as the client, and the mqd's fdatasync count and zeroed bytes per transaction.

usage: txsync_ab.py --base DIR --new DIR [--rounds 3] [--count 2000] [--dir /tmp]
  DIR holds mqd and mqperf; --new also needs examples/txfloor next to them (or --probe PATH).
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
import urllib.request

ROW = re.compile(r"^\S+\s+raw\s+(send|receive)\s+\d+\s+([\d,]+)\s+\S+\s+\S+\s+(\d+)\s+(\d+)")


def load():
    return open("/proc/loadavg").read().split()[0]


def mqperf(binary, count, broker=None):
    args = [binary, "TX", "SENDANDRECEIVE", ".\\private$\\txone", "--payload", "string:1000",
            "--formatter", "raw", "--count", str(count), "--runs", "1", "--one-at-a-time",
            "--receive-and-commit"]
    if broker:
        args += ["--broker", broker]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"mqperf failed: {out.stderr}")
    rows = {}
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (int(m.group(2).replace(",", "")), int(m.group(3)), int(m.group(4)))
    return rows


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


def with_mqd(mqd, workdir, metrics_port, fn):
    data = tempfile.mkdtemp(dir=workdir, prefix="txsync-")
    p = subprocess.Popen([mqd, "--listen", "127.0.0.1:0", "--data-dir", data,
                          "--metrics-listen", f"127.0.0.1:{metrics_port}"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        addr = line.strip().split()[-1]
        return fn(f"http://{addr}", metrics_port)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
        shutil.rmtree(data, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--probe")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--only-mqd", action="store_true", help="only the separate-mqd cells, new client")
    a = ap.parse_args()
    probe = a.probe or os.path.join(a.new, "txfloor")
    port = 19300 + os.getpid() % 500
    for r in range(1, a.rounds + 1):
        print(f"## round {r} {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load()}",
              flush=True)
        if os.path.exists(probe):
            out = subprocess.run([probe, "--dir", a.dir, "--count", "1000"], capture_output=True,
                                 text=True, timeout=300)
            print(out.stdout.rstrip(), flush=True)
        cells = [("embedded", "base", "base"), ("embedded", "new", "new")]
        cells += [("mqd", m, c) for m, c in [("base", "new"), ("new", "new"), ("new", "base")]]
        if a.only_mqd:
            cells = [("mqd", "base", "new"), ("mqd", "new", "new")]
        for kind, mqd_build, client_build in cells:
            client = os.path.join(getattr(a, client_build), "mqperf")
            if kind == "embedded":
                rows = mqperf(client, a.count)
                extra = ""
            else:
                def run(url, mport):
                    names = ["mq_journal_fdatasync_total", "mq_journal_zeroed_bytes_total",
                             "mq_journal_fdatasync_duration_seconds_sum"]
                    before = [metric(mport, n) for n in names]
                    rows = mqperf(client, a.count, url)
                    s, z, t = [metric(mport, n) - b for n, b in zip(names, before)]
                    # send, receive, then e2e (count sends and count receives at once)
                    n = 4 * a.count
                    return rows, (f" fdatasyncs/tx {s / n:.2f} mean fdatasync us {1e6 * t / max(s, 1):.0f}"
                                  f" zeroed KiB {z / 1024:.0f}")
                rows, extra = with_mqd(os.path.join(getattr(a, mqd_build), "mqd"), a.dir, port, run)
            s, v = rows.get("send"), rows.get("receive")
            print(f"{kind:<9} mqd={mqd_build:<4} client={client_build:<4} "
                  f"send {s[0]:>6}/s p50 {s[1]:>4} p99 {s[2]:>5} | "
                  f"receive_and_commit {v[0]:>6}/s p50 {v[1]:>4} p99 {v[2]:>5} | load {load()}{extra}",
                  flush=True)


if __name__ == "__main__":
    main()
