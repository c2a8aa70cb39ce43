#!/usr/bin/env python3
"""Where one synchronous transaction's time goes inside a separate mqd (issue 14 point 3).

Starts MQD (fresh data dir in --dir), records the whole machine with `perf record` (scheduler
switches and wake-ups, and the syscalls that mark a transaction: recvfrom, pwritev, fdatasync,
writev, futex, epoll_wait) while `mqperf TX SENDANDPURGE --one-at-a-time` (or
SENDANDRECEIVE with --receive-and-commit: --kind receive) runs against it, then splits every
transaction of mqd into segments, per thread:

  req   a worker's recvfrom returns the request            -> the writer is woken (submit)
  wake  the writer is woken                                -> it runs
  run   the writer runs                                    -> its pwritev starts
  disk  pwritev starts                                     -> fdatasync returns
  done  fdatasync returns                                  -> a worker is woken (completion)
  wsch  that worker is woken                               -> it runs
  reply the worker runs                                    -> the reply's writev starts
  rtt   the reply's writev starts                          -> the next request's recvfrom returns,
        split into: to_c (-> the client's recvfrom returns it), client (-> the client's writev of
        the next transaction starts), to_mqd (-> mqd's recvfrom returns it)

When the writer is already running (it did not sleep: no wake-up between the request and its
pwritev), `wake` and `run` are 0 and `req` runs to its pwritev; likewise for the worker.

usage: tx_timeline.py --mqd PATH --mqperf PATH [--count 3000] [--dir /tmp] [--kind send|receive]
                      [--mqd-arg=--journal-idle-spin=100us ...] [--mqperf-arg=--current-thread ...]
"""
import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

EVENTS = [
    "sched:sched_switch", "sched:sched_wakeup",
    "syscalls:sys_exit_recvfrom", "syscalls:sys_enter_pwritev", "syscalls:sys_exit_pwritev",
    "syscalls:sys_enter_fdatasync", "syscalls:sys_exit_fdatasync", "syscalls:sys_enter_writev",
]

LINE = re.compile(r"^\s*(\S.*?)\s+(\d+)/(\d+)\s+\[\d+\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]


def add_run_args(ap):
    """The arguments of `record_one_at_a_time` (shared with tx_hops.py)."""
    ap.add_argument("--mqd", required=True)
    ap.add_argument("--mqperf", required=True)
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--kind", default="send", choices=["send", "receive"])
    ap.add_argument("--mqd-arg", action="append", default=[], help="an extra argument for mqd")
    ap.add_argument("--mqperf-arg", action="append", default=[],
                    help="an extra argument for mqperf (e.g. --mqperf-arg=--current-thread)")


def record_one_at_a_time(a, events, prefix, before_kill=None):
    """Starts a.mqd (fresh data dir under a.dir), warms it up with 500 one-at-a-time
    transactions, then records `events` machine-wide with `perf record` while mqperf runs
    a.count of them (a.kind: send, or receive_and_commit), and prints the load and mqperf's
    result lines as comments. `before_kill(mqd_pid, perf_data_path)` runs while mqd is still
    alive. Returns the `perf script` output (comm, pid, tid, cpu, time, event, trace), mqd's
    pid and mqperf's pid; mqd is killed by its PID and the data dir removed."""
    data = tempfile.mkdtemp(dir=a.dir, prefix=prefix)
    pdata = os.path.join(data, "perf.data")
    mqd = subprocess.Popen([a.mqd, "--listen", "127.0.0.1:0", "--data-dir",
                            os.path.join(data, "d")] + a.mqd_arg,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = "http://" + mqd.stdout.readline().strip().split()[-1]
        base = [a.mqperf, "TX", "SENDANDPURGE" if a.kind == "send" else "SENDANDRECEIVE",
                ".\\private$\\" + prefix.rstrip("-"), "--payload", "string:1000",
                "--formatter", "raw", "--runs", "1", "--one-at-a-time", "--broker", url]
        base += a.mqperf_arg
        if a.kind == "receive":
            base.append("--receive-and-commit")
        # Warm up (queue created, zeros laid, connections made), then the measured run.
        subprocess.run(base + ["--count", "500"], check=True, capture_output=True, timeout=300)
        load = open("/proc/loadavg").read().split()[0]
        perf = subprocess.Popen(["perf", "record", "-q", "-a", "-o", pdata]
                                + sum((["-e", e] for e in events), []),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        client = subprocess.Popen(base + ["--count", str(a.count)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        stdout, _ = client.communicate(timeout=600)
        if client.returncode != 0:
            sys.exit("mqperf failed")
        perf.send_signal(signal.SIGINT)
        perf.wait()
        print(f"# {time.strftime('%H:%M:%S', time.gmtime())} UTC load {load} -> "
              f"{open('/proc/loadavg').read().split()[0]}")
        for line in stdout.splitlines():
            if " raw " in line:
                print("# " + line.strip())
        if before_kill:
            before_kill(mqd.pid, pdata)
        script = subprocess.run(["perf", "script", "-i", pdata, "--ns", "-F",
                                 "comm,pid,tid,cpu,time,event,trace"],
                                capture_output=True, text=True)
        return script.stdout, mqd.pid, client.pid
    finally:
        mqd.send_signal(signal.SIGKILL)
        mqd.wait()
        shutil.rmtree(data, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    add_run_args(ap)
    ap.add_argument("--keep", help="keep perf.data here")
    a = ap.parse_args()

    names = {}

    def thread_names(mqd_pid, pdata):
        for t in os.listdir(f"/proc/{mqd_pid}/task"):
            try:
                names[int(t)] = open(f"/proc/{mqd_pid}/task/{t}/comm").read().strip()
            except OSError:
                pass
        if a.keep:
            shutil.copy(pdata, a.keep)

    script, _, client_pid = record_one_at_a_time(a, EVENTS, "txtl-", thread_names)
    tids = set(names)

    writer = [t for t, n in names.items() if n.startswith("mq-journal-wri")]
    workers = set(t for t, n in names.items() if n.startswith("tokio-r"))
    if len(writer) != 1:
        sys.exit(f"no single writer thread among {names}")
    writer = writer[0]

    evs = []
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        _, pid, tid, ts, ev, rest = m.groups()
        evs.append((float(ts) * 1e6, int(pid), int(tid), ev, rest))

    switches = collections.Counter()
    tx = []          # per transaction: dict of timestamps
    cur = {}
    last_reply = None
    for ts, pid, tid, ev, rest in evs:
        if ev == "sched:sched_switch":
            nxt = int(re.search(r"next_pid=(\d+)", rest).group(1))
            prev = int(re.search(r"prev_pid=(\d+)", rest).group(1))
            if prev in tids:
                switches[names.get(prev, "?")] += 1
            if nxt == writer and "wake_w" in cur and "run_w" not in cur:
                cur["run_w"] = ts
            if nxt in workers and "wake_k" in cur and "run_k" not in cur and nxt == cur.get("k"):
                cur["run_k"] = ts
        elif ev == "sched:sched_wakeup":
            who = int(re.search(r"pid=(\d+)", rest).group(1))
            if who == writer and "req" in cur and "wake_w" not in cur and "pw" not in cur:
                cur["wake_w"] = ts
            if who in workers and "fd_x" in cur and "wake_k" not in cur and tid == writer:
                cur["wake_k"] = ts
                cur["k"] = who
        elif ev == "syscalls:sys_exit_recvfrom" and tid in workers:
            ret = int(rest.split()[-1], 16) if rest.split()[-1].startswith("0x") else int(rest.split()[-1])
            if ret > 0 and ret < (1 << 62) and "req" not in cur:
                cur["req"] = ts
                cur["req_tid"] = tid
        elif ev == "syscalls:sys_enter_pwritev" and tid == writer and "req" in cur and "pw" not in cur:
            cur["pw"] = ts
        elif ev == "syscalls:sys_exit_fdatasync" and tid == writer and "pw" in cur and "fd_x" not in cur:
            cur["fd_x"] = ts
        elif ev == "syscalls:sys_exit_recvfrom" and pid == client_pid and tx and "c_recv" not in tx[-1]:
            ret = rest.split()[-1]
            ret = int(ret, 16) if ret.startswith("0x") else int(ret)
            if 0 < ret < (1 << 62):
                tx[-1]["c_recv"] = ts
                tx[-1]["c_recv_tid"] = tid
        elif ev == "syscalls:sys_enter_writev" and pid == client_pid and tx and "c_recv" in tx[-1] \
                and "c_send" not in tx[-1]:
            tx[-1]["c_send"] = ts
            tx[-1]["c_send_tid"] = tid
        elif ev == "syscalls:sys_enter_writev" and tid in workers and "fd_x" in cur:
            cur["reply"] = ts
            cur["reply_tid"] = tid
            if last_reply is not None and tx:
                tx[-1]["next_req"] = cur["req"]
            tx.append(cur)
            last_reply = ts
            cur = {}
    # The rtt of transaction i ends at transaction i+1's request.
    for i in range(len(tx) - 1):
        tx[i]["next"] = tx[i + 1]["req"]

    segs = collections.OrderedDict((k, []) for k in
                                   ["req", "wake", "run", "disk", "done", "wsch", "reply", "rtt",
                                    "to_c", "client", "to_mqd", "total"])
    woke_w = woke_k = 0
    for t in tx:
        if not all(k in t for k in ("req", "pw", "fd_x", "reply")):
            continue
        if "wake_w" in t and "run_w" in t and t["run_w"] <= t["pw"]:
            woke_w += 1
            segs["req"].append(t["wake_w"] - t["req"])
            segs["wake"].append(t["run_w"] - t["wake_w"])
            segs["run"].append(t["pw"] - t["run_w"])
        else:
            segs["req"].append(t["pw"] - t["req"])
            segs["wake"].append(0)
            segs["run"].append(0)
        segs["disk"].append(t["fd_x"] - t["pw"])
        if "wake_k" in t and "run_k" in t and t["run_k"] <= t["reply"]:
            woke_k += 1
            segs["done"].append(t["wake_k"] - t["fd_x"])
            segs["wsch"].append(t["run_k"] - t["wake_k"])
            segs["reply"].append(t["reply"] - t["run_k"])
        else:
            segs["done"].append(t["reply"] - t["fd_x"])
            segs["wsch"].append(0)
            segs["reply"].append(0)
        if "next" in t:
            segs["rtt"].append(t["next"] - t["reply"])
            if "c_recv" in t and "c_send" in t and t["c_send"] <= t["next"]:
                segs["to_c"].append(t["c_recv"] - t["reply"])
                segs["client"].append(t["c_send"] - t["c_recv"])
                segs["to_mqd"].append(t["next"] - t["c_send"])
            segs["total"].append(t["next"] - t["req"])
    n = len(segs["disk"])
    print(f"# {n} transactions matched; writer woken in {woke_w}, a worker woken by the writer in {woke_k}")
    print(f"# mqd context switches per transaction: "
          + ", ".join(f"{k} {v / max(n, 1):.2f}" for k, v in sorted(switches.items())))
    # Which threads a transaction lands on: the same worker for the request and the reply, the
    # worker the writer woke writes the reply, the client reads the reply and writes the next
    # request on one thread.
    full = [t for t in tx if all(k in t for k in ("req_tid", "reply_tid"))]
    same = sum(1 for t in full if t["req_tid"] == t["reply_tid"])
    woken = [t for t in full if "k" in t]
    kw = sum(1 for t in woken if t["k"] == t["reply_tid"])
    cl = [t for t in tx if "c_recv_tid" in t and "c_send_tid" in t]
    cs = sum(1 for t in cl if t["c_recv_tid"] == t["c_send_tid"])
    print(f"# threads: mqd request and reply on one worker in {same} of {len(full)}; reply "
          f"written by the worker the writer woke in {kw} of {len(woken)}; client reads the "
          f"reply and writes the next request on one thread in {cs} of {len(cl)}")
    print(f"{'segment':<6} {'p50':>7} {'p90':>7} {'mean':>7}  (us)")
    for k, v in segs.items():
        if v:
            print(f"{k:<6} {pct(v, 0.5):7.1f} {pct(v, 0.9):7.1f} {sum(v) / len(v):7.1f}")


if __name__ == "__main__":
    main()
