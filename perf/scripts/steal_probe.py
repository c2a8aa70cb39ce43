#!/usr/bin/env python3
"""Does the host stop this VM's vCPUs? (docs/benchmarks.md, "The host takes ~10% of the CPU").

Starts N processes that spin reading CLOCK_MONOTONIC for --secs seconds and record every gap
over 1 ms (time the process did not run). Per spinner: the number of gaps, the time lost, the
largest gap and where the first dozen gaps began within a 100 ms period; then the machine's
steal ticks (/proc/stat) over the run. Run it alone, then beside disk writes (e.g.
`dd if=/dev/zero of=/tmp/x bs=64k count=30000 oflag=dsync`) to see whether writing makes the
host take the CPUs.

Usage: python3 perf/scripts/steal_probe.py [N=2] [--secs 3]
"""
import multiprocessing as mp
import sys
import time


def spin(secs, q):
    gaps = []
    t0 = time.monotonic()
    last = t0
    while True:
        t = time.monotonic()
        if t - last > 0.001:
            gaps.append((last - t0, (t - last) * 1e3))
        last = t
        if t - t0 > secs:
            break
    q.put(gaps)


def cpu_line():
    return [int(x) for x in open("/proc/stat").readline().split()[1:9]]


def main():
    args = sys.argv[1:]
    secs = 3.0
    if "--secs" in args:
        i = args.index("--secs")
        secs = float(args[i + 1])
        del args[i:i + 2]
    n = int(args[0]) if args else 2
    s0 = cpu_line()
    q = mp.Queue()
    ps = [mp.Process(target=spin, args=(secs, q)) for _ in range(n)]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    s1 = cpu_line()
    for i, g in enumerate(res):
        lost = sum(x for _, x in g)
        largest = max([x for _, x in g] or [0])
        phases = sorted(int((a * 1000) % 100) for a, _ in g)[:12]
        print(f"spinner {i}: {len(g)} gaps > 1 ms, {lost:.0f} ms lost of {secs * 1000:.0f}, "
              f"largest {largest:.1f} ms, ms into the 100 ms period (first 12) {phases}")
    print(f"steal ticks {s1[7] - s0[7]} of {sum(s1) - sum(s0)}")


if __name__ == "__main__":
    main()
