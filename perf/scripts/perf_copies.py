#!/usr/bin/env python3
"""Where the copies are: attributes `perf` samples whose leaf symbol matches LEAF_REGEX (e.g.
'mem(move|cpy)|memset') to their first caller outside the allocator, `bytes`, `core`, `std`
and libc, and prints each caller's share of ALL samples (docs/benchmarks.md, "Large bodies").

  perf record -F 499 --call-graph dwarf,16384 -o DATA <command>
  perf script -i DATA | perf/scripts/perf_copies.py 'mem(move|cpy)|memset'
"""
import sys, re, collections
leaf_re = re.compile(sys.argv[1])
skip = re.compile(r'^(__mem|_int_|__GI_|realloc|malloc|core::|alloc::|bytes::|<bytes::|<alloc::|std::|<core::|<std::|prost::encoding::bytes|prost::encoding::<impl|<tonic::codec::buffer|exc_page|asm_exc|do_|handle_mm|__handle|clear_page|\[unknown\])')
total = 0; hits = collections.Counter(); n_leaf = 0
frames = []
def flush():
    global total, n_leaf
    if not frames: return
    total += 1
    if leaf_re.search(frames[0]):
        n_leaf += 1
        for f in frames[1:]:
            if not skip.search(f):
                hits[f[:150]] += 1; break
        else:
            hits['?'] += 1
for line in sys.stdin:
    line = line.rstrip('\n')
    if not line.strip():
        flush(); frames = []; continue
    if line.startswith((' ', '\t')):
        parts = line.strip().split(' ', 1)
        if len(parts) == 2:
            sym = re.sub(r'\+0x[0-9a-f]+$', '', parts[1]).strip()
            sym = re.sub(r' \(inlined\)$', '', sym)
            sym = re.sub(r' \(/.*\)$', '', sym)
            frames.append(sym)
    else:
        flush(); frames = []
flush()
print(f"samples {total}, leaf {n_leaf} ({100*n_leaf/max(total,1):.1f}%)")
for f, c in hits.most_common(25):
    print(f"{100*c/max(total,1):5.1f}%  {f}")
