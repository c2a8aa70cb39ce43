#!/usr/bin/env python3
"""How fast this machine faults in fresh anonymous memory (docs/benchmarks.md, "Fresh memory").

Maps 1 GiB, touches one byte per 4 KiB page (fresh: every touch a page fault), touches it
again (mapped: only the loop's own cost), unmaps it; --passes times, then once more with
MADV_HUGEPAGE; then maps fresh memory with madvise(MADV_POPULATE_WRITE) in one call and in
104 KiB calls (as mqd's allocator does for fresh blocks, broker/src/prefault.rs), and the
104 KiB calls again on the mapped memory (what a needless call would cost). Prints GB/s for each.

Usage: python3 perf/scripts/fault_probe.py [--passes 4]
"""
import mmap
import sys
import time

N = 1 << 30


def touch(m, value):
    t = time.perf_counter()
    for off in range(0, N, 4096):
        m[off] = value
    return N / (time.perf_counter() - t) / 1e9


def main():
    passes = int(sys.argv[sys.argv.index("--passes") + 1]) if "--passes" in sys.argv else 4
    for i in range(passes):
        m = mmap.mmap(-1, N)
        fresh = touch(m, 1)
        again = touch(m, 2)
        m.close()
        print(f"pass {i}: fresh {fresh:.2f} GB/s, touched again {again:.2f} GB/s (the loop)")
    m = mmap.mmap(-1, N)
    m.madvise(mmap.MADV_HUGEPAGE)
    print(f"MADV_HUGEPAGE: fresh {touch(m, 1):.2f} GB/s")
    m.close()
    for i in range(2):
        m = mmap.mmap(-1, N)
        print(f"MADV_POPULATE_WRITE pass {i}: 1 GiB in one call {populate(m, N):.2f} GB/s", end="")
        m.close()
        m = mmap.mmap(-1, N)
        fresh = populate(m, CHUNK)
        again = populate(m, CHUNK)
        m.close()
        print(f"; in {CHUNK // 1024} KiB calls {fresh:.2f} GB/s, again on mapped memory {again:.2f} GB/s")


CHUNK = 26 * 4096
MADV_POPULATE_WRITE = 23  # Linux 5.14; not in every Python's mmap module


def populate(m, chunk):
    t = time.perf_counter()
    for off in range(0, N, chunk):
        m.madvise(MADV_POPULATE_WRITE, off, chunk)
    return N / (time.perf_counter() - t) / 1e9


if __name__ == "__main__":
    main()
