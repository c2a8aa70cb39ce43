#!/usr/bin/env python3
"""The disk alone: 1 GiB written in group commits of BATCH bytes, each followed by one
fdatasync, four ways (docs/benchmarks.md, "Writeback started while the batch is written"):

  one        one pwrite of the batch, then fdatasync (what the journal did before)
  pieces     the batch in 1 MiB pwrites, each followed by sync_file_range(SYNC_FILE_RANGE_WRITE),
             then one fdatasync (what the journal does now: JournalOptions::writeback_bytes)
  split      1 MiB pwrite + fdatasync each (more syncs; for comparison)
  written    'one' into a file whose blocks were written before (no unwritten extents)

The file is preallocated with posix_fallocate (unwritten extents), as journal segments are.
Usage: perf/scripts/writeback_probe.py [DIR] [ROUNDS]   (DIR on the file system under test)
"""
import ctypes
import os
import sys
import time

libc = ctypes.CDLL("libc.so.6", use_errno=True)
SFR_WRITE = 2
DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp/writeback_probe"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
TOTAL = 1 << 30
MIB = 1 << 20
os.makedirs(DIR, exist_ok=True)


def run(strat, batch):
    path = os.path.join(DIR, "probe")
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, TOTAL)
        if strat == "written":
            zeros = b"\0" * MIB
            for i in range(TOTAL // MIB):
                os.pwrite(fd, zeros, i * MIB)
            os.fsync(fd)
        piece = b"x" * MIB
        start = time.perf_counter()
        off = 0
        while off < TOTAL:
            n = batch // MIB
            if strat in ("one", "written"):
                os.pwrite(fd, piece * n, off)
                os.fdatasync(fd)
            elif strat == "pieces":
                for i in range(n):
                    os.pwrite(fd, piece, off + i * MIB)
                    if i + 1 < n:
                        libc.sync_file_range(ctypes.c_int(fd), ctypes.c_longlong(off + i * MIB),
                                             ctypes.c_longlong(MIB), ctypes.c_uint(SFR_WRITE))
                os.fdatasync(fd)
            elif strat == "split":
                for i in range(n):
                    os.pwrite(fd, piece, off + i * MIB)
                    os.fdatasync(fd)
            off += batch
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    print(f"{strat:8} batch {batch // MIB} MiB: {TOTAL / elapsed / 1e6:6.0f} MB/s", flush=True)


for _ in range(ROUNDS):
    for batch in (2 * MIB, 5 * MIB):
        for strat in ("one", "pieces", "split", "written"):
            run(strat, batch)
