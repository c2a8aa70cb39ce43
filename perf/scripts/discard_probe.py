#!/usr/bin/env python3
"""fdatasync latency of a journal-like writer while another process frees (or keeps) 256 MiB.

The question (issue 14 point 6, docs/benchmarks.md "Reusing dropped segments"): on this VM's
ext4 (mounted with `discard`), does freeing a dropped segment's blocks stall the journal
writer's fdatasyncs, and which way of getting rid of the space does not?

Writer (this process): a fresh file preallocated with fallocate (like a new segment), then
1000 commits a second: pwrite of 4-100 KiB at the next offset + fdatasync, for --secs seconds.
Alongside (a forked child, started --start seconds in): one of

  none         nothing
  trunc1m      today's retire: rename, fsync dir, ftruncate down 1 MiB at a time with a 1 ms
               pause after each step, unlink, fsync dir
  unlink       unlink the whole file at once, fsync dir
  zero         fallocate(FALLOC_FL_ZERO_RANGE) over the whole file, fdatasync
  zero64       the same in four 64 MiB calls (one per segment), fdatasync after each
  punch        fallocate(FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE) over the whole file, fdatasync
  rename       rename the file, fsync dir (kept)

The 256 MiB victim is written with data and synced (and the machine left 1 s to settle) before
each trial, like the segments a drained backlog leaves behind. Variants are alternated in each
round. Reported per variant: fdatasync p50/p99/p99.9/max over the disturbance window (from its
start to 300 ms after it ended) and over the whole run, how long the disturbance took, and the
disk's discard and write sectors during the run (/sys/block/DEV/stat).

Usage: python3 perf/scripts/discard_probe.py [--dir /tmp/discard_probe] [--rounds 5]
       [--variants none,trunc1m,...] [--secs 3] [--dev vda]
"""

import argparse
import ctypes
import os
import random
import statistics
import time

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
MIB = 1 << 20
VICTIM = 256 * MIB
WRITER = 256 * MIB

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def fsync_dir(d):
    fd = os.open(d, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def disk_stat(dev):
    f = open(f"/sys/block/{dev}/stat").read().split()
    # fields: 7 = write sectors (index 6), 14 = discard sectors (index 13)
    return int(f[6]), int(f[13]) if len(f) > 13 else 0


def make_victim(path):
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    fallocate(fd, 0, 0, VICTIM)
    buf = os.urandom(MIB)
    for off in range(0, VICTIM, MIB):
        os.pwrite(fd, buf, off)
    os.fdatasync(fd)
    os.close(fd)


def disturb(variant, d, victim):
    """Runs in the child; returns nothing, exits."""
    if variant == "none":
        return
    if variant == "trunc1m":
        retired = victim + ".retired"
        os.rename(victim, retired)
        fsync_dir(d)
        fd = os.open(retired, os.O_WRONLY)
        n = os.fstat(fd).st_size
        while n > MIB:
            n -= MIB
            os.ftruncate(fd, n)
            time.sleep(0.001)
        os.close(fd)
        os.unlink(retired)
        fsync_dir(d)
    elif variant == "unlink":
        os.unlink(victim)
        fsync_dir(d)
    elif variant in ("zero", "zero64", "punch"):
        fd = os.open(victim, os.O_RDWR)
        if variant == "zero":
            fallocate(fd, FALLOC_FL_ZERO_RANGE, 0, VICTIM)
            os.fdatasync(fd)
        elif variant == "zero64":
            for off in range(0, VICTIM, 64 * MIB):
                fallocate(fd, FALLOC_FL_ZERO_RANGE, off, 64 * MIB)
                os.fdatasync(fd)
        else:
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, VICTIM)
            os.fdatasync(fd)
        os.close(fd)
    elif variant == "rename":
        os.rename(victim, victim + ".kept")
        fsync_dir(d)
    else:
        raise SystemExit(f"unknown variant {variant}")


def pct(v, p):
    if not v:
        return float("nan")
    s = sorted(v)
    return s[min(len(s) - 1, int(p / 100.0 * len(s)))]


def trial(variant, args):
    d = args.dir
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    victim = os.path.join(d, "victim")
    make_victim(victim)
    wpath = os.path.join(d, "writer")
    wfd = os.open(wpath, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    fallocate(wfd, 0, 0, WRITER)
    os.fsync(wfd)
    fsync_dir(d)
    time.sleep(1.0)
    rnd = random.Random(7)
    payload = os.urandom(100 * 1024)
    w0, dsc0 = disk_stat(args.dev)
    # The child reports when it started and ended through a pipe.
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        time.sleep(args.start)
        a = time.monotonic()
        disturb(variant, d, victim)
        b = time.monotonic()
        os.write(w, f"{a - t0} {b - t0}\n".encode())
        os._exit(0)
    os.close(w)
    lat = []  # (t, seconds)
    off = 0
    nxt = t0
    end = t0 + args.secs
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if now < nxt:
            time.sleep(nxt - now)
        nxt += 0.001
        n = rnd.randint(4 * 1024, 100 * 1024)
        if off + n > WRITER:
            off = 0
        os.pwrite(wfd, payload[:n], off)
        off += n
        a = time.monotonic()
        os.fdatasync(wfd)
        b = time.monotonic()
        lat.append((a - t0, b - a))
    os.waitpid(pid, 0)
    ds, de = (float(x) for x in os.read(r, 100).decode().split())
    os.close(r)
    os.close(wfd)
    w1, dsc1 = disk_stat(args.dev)
    window = [x for t, x in lat if ds <= t <= de + 0.3]
    allv = [x for _, x in lat]
    return {
        "window": window,
        "all": allv,
        "took": de - ds,
        "commits": len(lat),
        "write_mib": (w1 - w0) * 512 / MIB,
        "discard_mib": (dsc1 - dsc0) * 512 / MIB,
    }


def fmt(v):
    return " ".join(f"{pct(v, p) * 1e3:6.2f}" for p in (50, 99, 99.9)) + f" {max(v) * 1e3:6.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/discard_probe")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="none,trunc1m,unlink,zero,zero64,punch,rename")
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--start", type=float, default=0.5)
    ap.add_argument("--dev", default="vda")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    variants = args.variants.split(",")
    res = {v: [] for v in variants}
    print("variant   round  window: p50 p99 p99.9 max (ms)   all: p50 p99 p99.9 max (ms)"
          "   took_ms commits write_MiB discard_MiB load1", flush=True)
    for rd in range(args.rounds):
        order = variants if rd % 2 == 0 else list(reversed(variants))
        for v in order:
            x = trial(v, args)
            res[v].append(x)
            load = os.getloadavg()[0]
            print(f"{v:9} {rd + 1:5}  {fmt(x['window'])}   {fmt(x['all'])}   {x['took'] * 1e3:7.1f}"
                  f" {x['commits']:7} {x['write_mib']:9.0f} {x['discard_mib']:11.0f} {load:5.2f}",
                  flush=True)
    print("\nall rounds pooled (window: from the disturbance's start to 300 ms after its end)")
    print("variant   window: p50 p99 p99.9 max (ms)   all: p50 p99 p99.9 max   took_ms median  >2ms in window")
    for v in variants:
        win = [y for x in res[v] for y in x["window"]]
        allv = [y for x in res[v] for y in x["all"]]
        took = statistics.median(x["took"] for x in res[v]) * 1e3
        over = sum(1 for y in win if y > 0.002)
        print(f"{v:9}         {fmt(win)}        {fmt(allv)}   {took:7.1f}  {over}/{len(win)}")
    for name in os.listdir(args.dir):
        os.unlink(os.path.join(args.dir, name))


if __name__ == "__main__":
    main()
