#!/usr/bin/env python3
"""fdatasync latency against the commit rate, with nothing of mq in it (docs/benchmarks.md,
"The disk's budget: stalls every 100 ms").

A journal-like writer: a file preallocated with fallocate and its blocks written once (so no
extent conversion), then commits at a fixed rate, each a pwrite of --size bytes at the next
offset plus an fdatasync, paced open-loop (commit k is due k/rate s after the start; a late
commit goes at once). Per rate: commits done per second, fdatasync p50 / p99 / max, how many
took over 5 ms, and where in the 100 ms period (ms after the last multiple of 100 ms of
CLOCK_MONOTONIC) those slow ones started, as a histogram of 10 ms bins: a host-side token
bucket that refills every 100 ms shows up as slow commits bunched in one or two bins.

Usage: python3 perf/scripts/iops_probe.py [--dir /tmp] [--size 16384] [--secs 3]
       [--rates 500,1000,1500,2000,3000,0]     (0: as fast as it goes)
"""
import argparse
import os
import time


def run(path, size, secs, rate):
    n = 64 << 20
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, n)
        zeros = bytes(1 << 20)
        for off in range(0, n, len(zeros)):
            os.pwrite(fd, zeros, off)
        os.fsync(fd)
        time.sleep(0.5)
        buf = os.urandom(size)
        lat, starts = [], []
        off = 0
        t0 = time.monotonic()
        k = 0
        while True:
            now = time.monotonic()
            if now - t0 >= secs:
                break
            if rate:
                due = t0 + k / rate
                if due > now:
                    time.sleep(due - now)
            if off + size > n:
                off = 0
            s = time.monotonic()
            os.pwrite(fd, buf, off)
            os.fdatasync(fd)
            e = time.monotonic()
            lat.append(e - s)
            starts.append(s)
            off += size
            k += 1
        elapsed = time.monotonic() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    srt = sorted(lat)
    slow = [s for s, l in zip(starts, lat) if l > 0.005]
    bins = [0] * 10
    for s in slow:
        bins[int((s * 1000) % 100) // 10] += 1
    return {
        "per_s": len(lat) / elapsed,
        "p50": srt[len(srt) // 2] * 1e3,
        "p99": srt[int(len(srt) * 0.99)] * 1e3,
        "max": srt[-1] * 1e3,
        "slow": len(slow),
        "bins": bins,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--rates", default="500,1000,1500,2000,3000,0")
    a = ap.parse_args()
    path = os.path.join(a.dir, f"iops_probe.{os.getpid()}")
    print(f"# {a.size} B a commit, {a.secs} s a rate, {a.dir}; load {os.getloadavg()[0]:.2f}")
    print("asked/s   done/s  p50 ms  p99 ms  max ms  >5ms  slow ones by ms into the 100 ms period "
          "(0-9, 10-19, ...)")
    for r in (int(x) for x in a.rates.split(",")):
        x = run(path, a.size, a.secs, r)
        print(f"{r or 'max':>7} {x['per_s']:8.0f} {x['p50']:7.2f} {x['p99']:7.2f} {x['max']:7.1f}"
              f" {x['slow']:5}  {' '.join(str(b) for b in x['bins'])}", flush=True)


if __name__ == "__main__":
    main()
