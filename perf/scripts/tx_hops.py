#!/usr/bin/env python3
"""Thread hops of one synchronous transaction, on both sides (issue 14 point 3, branch txhops).

Starts MQD (fresh data dir in --dir), warms up, then records the whole machine with `perf record`
(sched_switch, sched_wakeup) while `mqperf TX SENDANDPURGE --one-at-a-time` (or SENDANDRECEIVE
--receive-and-commit: --kind receive) runs against it, and prints per transaction, for mqd and
for mqperf:

  wakeups   sched_wakeup events of the process's threads, by wakee thread kind and by who woke
            it (the same thread's process: "self"; the other process; the kernel / an idle CPU
            ("irq/idle": a timer, or a wake-up the kernel ran on the target CPU by an IPI, whose
            real waker the trace does not name); another process)
  sleeps    the threads' switches out with prev_state S or D (each a park: epoll_wait, futex,
            fdatasync), by thread kind
  migr      wake-ups whose target CPU differs from the waker's CPU
  syscalls  writev, sendto, write, recvfrom, read, epoll_wait, futex, sched_yield, by thread kind

A wake-up is a thread hop: a task hop between two tasks on one runtime thread costs none, one
across threads costs one (and usually a park and an idle CPU's exit). mqperf counts its one
transaction loop and its phase's setup: divide by --count (the warm-up is not recorded).

usage: tx_hops.py --mqd PATH --mqperf PATH [--count 3000] [--kind send|receive] [--dir /tmp]
                  [--mqd-arg=... ...] [--mqperf-arg=... ...]
"""
import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tx_timeline import add_run_args, record_one_at_a_time  # noqa: E402

SYSCALLS = ["writev", "sendto", "write", "recvfrom", "read", "epoll_wait", "futex", "sched_yield"]
LINE = re.compile(r"^\s*(\S.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


def kind(comm):
    for p, k in (("tokio-r", "worker"), ("mq-journal-wri", "writer")):
        if comm.startswith(p):
            return k
    return "main" if "mq" in comm else comm


def main():
    ap = argparse.ArgumentParser()
    add_run_args(ap)
    a = ap.parse_args()

    events = ["sched:sched_switch", "sched:sched_wakeup"]
    events += [f"syscalls:sys_enter_{c}" for c in SYSCALLS]
    script, mqd_pid, client_pid = record_one_at_a_time(a, events, "txhops-")
    procs = {mqd_pid: "mqd", client_pid: "mqperf"}

    evs = []
    owner = {}  # tid -> (process name, thread kind)
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, cpu, _, ev, rest = m.groups()
        pid, tid = int(pid), int(tid)
        if pid in procs:
            owner[tid] = (procs[pid], kind(comm))
        evs.append((pid, tid, int(cpu), ev, rest))

    wakeups = collections.Counter()
    sleeps = collections.Counter()
    migr = collections.Counter()
    calls = collections.Counter()
    for pid, tid, cpu, ev, rest in evs:
        if ev == "sched:sched_wakeup":
            wakee = int(re.search(r"\bpid=(\d+)", rest).group(1))
            if wakee not in owner:
                continue
            proc, k = owner[wakee]
            if pid == 0:
                by = "irq/idle"
            elif pid in procs:
                by = "self" if procs[pid] == proc else procs[pid]
                by += f" {owner.get(tid, (None, '?'))[1]}"
            else:
                by = "other"
            wakeups[(proc, k, by)] += 1
            target = re.search(r"target_cpu=(\d+)", rest)
            if target and int(target.group(1)) != cpu:
                migr[(proc, k)] += 1
        elif ev.startswith("syscalls:sys_enter_") and tid in owner:
            calls[owner[tid] + (ev[len("syscalls:sys_enter_"):],)] += 1
        elif ev == "sched:sched_switch":
            prev = int(re.search(r"prev_pid=(\d+)", rest).group(1))
            state = re.search(r"prev_state=(\S+)", rest).group(1)
            if prev in owner and state[0] in "SD":
                sleeps[owner[prev] + (state[0],)] += 1
    n = a.count
    print(f"# per transaction ({n}), kind {a.kind}")
    print("wakeups: process thread <- waker")
    for (proc, k, by), c in sorted(wakeups.items()):
        print(f"  {proc:<7} {k:<8} <- {by:<16} {c / n:6.2f}")
    print("sleeps (switched out in S or D):")
    for (proc, k, st), c in sorted(sleeps.items()):
        print(f"  {proc:<7} {k:<8} {st} {c / n:6.2f}")
    print("wake-ups onto another CPU than the waker's:")
    for (proc, k), c in sorted(migr.items()):
        print(f"  {proc:<7} {k:<8} {c / n:6.2f}")
    print("syscalls:")
    for (proc, k, c), v in sorted(calls.items()):
        print(f"  {proc:<7} {k:<8} {c:<12} {v / n:6.2f}")
    tot = collections.Counter()
    for (proc, _, _), c in wakeups.items():
        tot[proc] += c
    print("total wakeups per transaction: " + ", ".join(f"{p} {c / n:.2f}" for p, c in
                                                          sorted(tot.items())))


if __name__ == "__main__":
    main()
